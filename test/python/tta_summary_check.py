"""bench/python/tta_summary.py, the summary of the time-to-accuracy harness: hand-made runs of
three arms (one seed of which missed the target, one arm unavailable) give the medians, spreads
and ratio worked out by hand below; a malformed results line is named. One process, no torch.

  tta_summary_check.py        (PYTHONPATH must reach bench/python)
"""

import json
import os
import subprocess
import sys
import tempfile

import tta_summary
from expect import expect_eq


def run(seed, name, t, steps, acc, step_ms, sent=None, reached=True, evals=()):
    # final_loss: the last evaluation's loss, as tta.py records it (absent in an older record).
    final_loss = {"final_loss": evals[-1][2]} if evals and len(evals[-1]) > 2 else {}
    return {**final_loss, "evals": [list(e) for e in evals], "name": name, "arm": name, "seed": seed, "status": "ok", "reached": reached,
            "time_to_target_s": t if reached else None, "steps_to_target": steps if reached else None,
            "final_accuracy": acc, "step_median_ms": step_ms, "bytes_sent_per_rank": sent,
            "ranks": 2, "batch_per_rank": 32, "params": 10, "gradient_mib": 0.0, "lr": 0.02, "target": 0.95,
            "eval_every": 10, "max_steps": 100}


def main():
    # Evaluations [step, accuracy, held-out loss]: topk's seed 2 stopped before step 30; ddp's seed 1
    # has no loss (an older record) at step 100.
    ddp_evals = [(10, 0.5, 2.0), (30, 0.8, 1.0), (60, 0.9, 0.5)]
    rows = [run(1, "ddp-fp32", 12.0, 130, 0.95, 100.0, evals=ddp_evals + [(100, 0.95)]),
            run(1, "topk", 6.0, 200, 0.96, 30.0, [100, 300], evals=[(10, 0.4, 2.2), (30, 0.7, 1.4)]),
            {"name": "gravac", "seed": 1, "status": "unavailable: cupcake.torch has no GraVAC"},
            run(2, "ddp-fp32", 10.0, 120, 0.96, 90.0, evals=[(10, 0.5, 1.8), (30, 0.8, 1.2), (60, 0.9, 0.7),
                                                             (100, 0.95, 0.3)]),
            run(2, "topk", 0, 0, 0.90, 32.0, [200, 100], reached=False, evals=[(10, 0.4, 2.4)]),
            run(3, "ddp-fp32", 14.0, 140, 0.97, 110.0, evals=[(10, 0.5, 2.1), (30, 0.8, 0.9), (60, 0.9, 0.6),
                                                              (100, 0.95, 0.2)]),
            run(3, "topk", 4.0, 190, 0.95, 31.0, [50, 60], evals=[(10, 0.4, 2.3), (30, 0.7, 1.6)])]
    s = tta_summary.summarize(rows)
    expect_eq("arm order", list(s), ["ddp-fp32", "topk", "gravac"])
    expect_eq("ddp median time", s["ddp-fp32"]["median_time_to_target_s"], 12.0)
    expect_eq("topk reached", (s["topk"]["ok"], s["topk"]["reached"]), (3, 2))
    expect_eq("topk median time (reached seeds 1 and 3)", s["topk"]["median_time_to_target_s"], 5.0)
    expect_eq("topk bytes (largest rank per run)", s["topk"]["bytes_sent_per_rank"], [300, 200, 60])
    table = tta_summary.table(s)
    expect_eq("header", table[0].split(), ["arm", "ok/runs", "reached", "time_to_target_s", "steps_to_target",
                                           "final_accuracy", "final_loss", "step_median_ms", "bytes_sent_per_rank",
                                           "vs_ddp32"])
    # ddp: times 12, 10, 14 -> 12.00 [10.00-14.00]; ratio 12 / 12. topk: 6, 4 -> median 5; 12 / 5 = 2.40x;
    # steps 200, 190 -> 195 (%d of 195.0); accuracy 0.96, 0.90, 0.95 -> 0.9500; bytes 300, 200, 60 -> 200.
    # Final loss: ddp's seed 1 has none (its last evaluation has no loss), seeds 2, 3: 0.3, 0.2 ->
    # median 0.25; topk's last losses 1.4, 2.4, 1.6 -> 1.6000 [1.4000-2.4000].
    expect_eq("ddp row", table[1].split(), ["ddp-fp32", "3/3", "3/3", "12.00", "[10.00-14.00]", "130", "[120-140]",
                                            "0.9600", "[0.9500-0.9700]", "0.2500", "[0.2000-0.3000]", "100.0",
                                            "[90.0-110.0]", "-", "1.00x"])
    expect_eq("topk row", table[2].split(), ["topk", "3/3", "2/3", "5.00", "[4.00-6.00]", "195", "[190-200]",
                                             "0.9500", "[0.9000-0.9600]", "1.6000", "[1.4000-2.4000]", "31.0",
                                             "[30.0-32.0]", "200", "[60-300]", "2.40x"])
    # The footer's target and its direction: a CNN record (no target_metric), an LSTM's.
    expect_eq("cnn footer", tta_summary.footer(rows[0]).split(", ")[4], "target held-out accuracy >= 0.95")
    lstm = dict(rows[0], model="lstm", target=1.75, target_metric="loss")
    expect_eq("lstm footer", tta_summary.footer(lstm).split(", ")[:2], ["(lstm", "2 ranks"])
    expect_eq("lstm footer target", tta_summary.footer(lstm).split(", ")[5], "target held-out loss <= 1.75")
    expect_eq("gravac row", table[3].split(None, 3), ["gravac", "0/1", "-", "unavailable: cupcake.torch has no GraVAC"])
    # Held-out loss: ddp at 10: 2.0, 1.8, 2.1 -> 2.0000 [1.8000-2.1000]; at 30: 1.0 [0.9-1.2]; at 60: 0.6
    # [0.5-0.7]; at 100 seed 1 has no loss: "-". topk at 10: 2.2, 2.4, 2.3 -> 2.3; 30, 60, 100: "-".
    losses = tta_summary.loss_table(s)
    expect_eq("loss header", losses[0].split(), ["held-out", "loss", "at", "step", "10", "30", "60", "100"])
    expect_eq("ddp losses", losses[1].split(), ["ddp-fp32", "2.0000", "[1.8000-2.1000]", "1.0000", "[0.9000-1.2000]",
                                                "0.6000", "[0.5000-0.7000]", "-"])
    expect_eq("topk losses", losses[2].split(), ["topk", "2.3000", "[2.2000-2.4000]", "-", "-", "-"])
    expect_eq("loss rows (gravac has no ok run)", len(losses), 3)

    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "results.jsonl")
        with open(good, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        out = os.path.join(tmp, "results.json")
        p = subprocess.run([sys.executable, tta_summary.__file__, good, out], capture_output=True, text=True)
        expect_eq("exit", p.returncode, 0)
        expect_eq("results.json runs", len(json.load(open(out))["runs"]), 7)
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps(rows[0]) + "\n{\"seed\": 1}\n")
        p = subprocess.run([sys.executable, tta_summary.__file__, bad, out], capture_output=True, text=True)
        expect_eq("bad line exit", p.returncode, 1)
        expect_eq("bad line message", p.stderr, "tta_summary.py: %s:2: missing 'name' or 'status'\n" % bad)
    print("ok: tta summary")


if __name__ == "__main__":
    main()

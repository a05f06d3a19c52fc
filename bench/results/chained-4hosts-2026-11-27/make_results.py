#!/usr/bin/env python3
"""results.json from raw.tar.xz: per model, evaluate.sh's rows (raw/MODEL-4x1-1gbit/results.json),
each with `predicted_spaced_only_ms`, the same plan re-priced on the same profile less its chained
curves (raw/MODEL-4x1-1gbit/spaced-only/NAME.json, `cupcake-plan simulate`), and
`predicted_held_tail_ms`, the same plan re-priced on the same profile by the planner that holds a
chained curve's excess above its last point (raw/MODEL-4x1-1gbit/held-tail/NAME.json, commit
88c7b5c), each with its measured/predicted beside evaluate.sh's `measured_over_predicted`."""
import json
import os
import sys
import tarfile
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
out = {}
with tempfile.TemporaryDirectory() as tmp:
    with tarfile.open(os.path.join(here, "raw.tar.xz")) as tar:
        tar.extractall(tmp)
    for model in ("resnet50", "bert_base", "gpt2", "vgg16"):
        d = os.path.join(tmp, "raw", f"{model}-4x1-1gbit")
        rows = json.load(open(os.path.join(d, "results.json")))
        for r in rows:
            name = f"{r['model']}-{r['strategy']}-{r['compressor']}"
            for what in ("spaced-only", "held-tail"):
                sim = json.load(open(os.path.join(d, what, f"{name}.json")))
                if abs(sim["plan_iteration_us"] / 1000 - r["predicted_ms"]) > 1e-6 * r["predicted_ms"]:
                    sys.exit(f"{name}: the simulated plan's own prediction {sim['plan_iteration_us']} us is not "
                             f"results.json's {r['predicted_ms']} ms")
                key = what.replace("-", "_")
                r[f"predicted_{key}_ms"] = round(sim["iteration_us"] / 1000, 3)
                r[f"measured_over_{key}"] = round(r["measured_ms"] / r[f"predicted_{key}_ms"], 4)
        out[model] = rows
json.dump(out, open(os.path.join(here, "results.json"), "w"), indent=1)
print("wrote results.json:", ", ".join(f"{m} {len(r)} rows" for m, r in out.items()))

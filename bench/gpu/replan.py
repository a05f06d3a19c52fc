#!/usr/bin/env python3
"""How plans change with new GPU kernel curves: a base profile's GPU encode/decode curves are
replaced by those of each given GPU kernel profile (cupcake-profile kernels --device gpu,
exported), then cupcake-plan searches each model x compressor on each profile.
Usage: bench/gpu/replan.py BASE.json OUT_DIR LABEL=GPU.profile.json [LABEL=...]
Writes OUT_DIR/<label>.profile.json and prints one row per model, compressor and label."""
import json, os, subprocess, sys

base_path, out_dir, pairs = sys.argv[1], sys.argv[2], [a.split("=", 1) for a in sys.argv[3:]]
plan = os.environ.get("CUPCAKE_PLAN", "build/tools/cupcake-plan")
os.makedirs(out_dir, exist_ok=True)
base = json.load(open(base_path))
gpu_kernel = lambda c: c["kind"] in ("encode", "decode") and c.get("device") == "gpu"
profiles = {}
for label, path in pairs:
    merged = dict(base)
    kernels = [c for c in json.load(open(path))["curves"] if gpu_kernel(c)]
    merged["curves"] = [c for c in base["curves"] if not gpu_kernel(c)] + kernels
    merged["cluster"] = dict(base["cluster"], source=base["cluster"].get("source", "") +
                             f"; GPU kernel curves from {os.path.basename(path)} ({label})")
    profiles[label] = os.path.join(out_dir, f"{label}.profile.json")
    json.dump(merged, open(profiles[label], "w"), indent=1)
print(f"{'model':10} {'compressor':10} {'kernels':8} {'groups':>6} {'plan_ms':>9} {'layerwise_ms':>12} "
      f"{'bucket25_ms':>11} {'fp32_bucket25_ms':>16}")
for model in ("resnet50", "bert_base", "vgg16"):
    for comp in ("efsignsgd", "topk", "qsgd"):
        for label, prof in profiles.items():
            pb = os.path.join(out_dir, f"{model}-{comp}-{label}.pb")
            s = json.loads(subprocess.run(
                [plan, "search", "--model", f"examples/models/{model}.json", "--profile", prof, "--compressor", comp,
                 "--device", "gpu", "--format", "json", "-o", pb], check=True, capture_output=True, text=True).stdout)
            b = {x["name"]: x["iteration_us"] / 1e3 for x in s["baselines"]}
            print(f"{model:10} {comp:10} {label:8} {s['groups']:>6} {s['iteration_us'] / 1e3:>9.1f} "
                  f"{b['layerwise']:>12.1f} {b['bucket_25mib']:>11.1f} {b['fp32_bucket_25mib']:>16.1f}")

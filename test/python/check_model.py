"""Checks the model `cupcake-profile export` printed (stdin) against the order record_job.py found
with tensor hooks (argv[1]): the same tensors, names, sizes and shapes, in the same gradient-ready order,
times that are finite and >= 0, forward and update times recorded, and every gradient's density
(its share of non-zeros, sampled each recorded iteration) in (0, 1]."""

import json
import math
import sys

expected = [(name, numel, tuple(shape)) for name, numel, shape in json.load(open(sys.argv[1]))]
exported = json.load(sys.stdin)
models = exported.get("models", [exported])
model = [m for m in models if m.get("name") == "pycnn"]
if len(model) != 1:
    sys.exit("FAIL: model 'pycnn' not in the export; got %s" % [m.get("name") for m in models])
model = model[0]
got = [(t["name"], t["numel"], tuple(t.get("shape", []))) for t in model["tensors"]]
if got != expected:
    sys.exit("FAIL: tensors; got %s, expected (tensor hooks' order) %s" % (got, expected))
times = [t["backward_us"] for t in model["tensors"]]
if not all(math.isfinite(t) and t >= 0 for t in times) or sum(times) <= 0:
    sys.exit("FAIL: backward_us; got %s, expected finite, >= 0, not all 0" % times)
for key in ("forward_us", "update_us"):
    if not (key in model and math.isfinite(model[key]) and model[key] > 0):
        sys.exit("FAIL: %s; got %s, expected > 0" % (key, model.get(key)))
densities = [t.get("density") for t in model["tensors"]]
if not all(d is not None and 0 < d <= 1 for d in densities):
    sys.exit("FAIL: density; got %s, expected every tensor's in (0, 1]" % densities)
print("ok: model pycnn: %d tensors in gradient-ready order, backward %.0f us, forward %.0f us, update %.0f us"
      % (len(got), sum(times), model["forward_us"], model["update_us"]))

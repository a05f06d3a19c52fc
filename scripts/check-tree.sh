#!/usr/bin/env bash
# Fails when the tracked tree (git ls-files, at their sizes in the work tree) passes LIMIT MiB
# (default 24): the tree travels to GPU machines under a 64 MiB cap that build outputs share, so
# raw experiment output goes into one compressed archive per experiment (bench/results/README.md);
# and when such an archive holds a plot (.png or .svg: drawn again from the runs, and PNG does not
# compress).
# Prints the total and the five largest directories under bench/results.
# Usage: scripts/check-tree.sh [LIMIT_MIB]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
limit="${1:-24}"
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "check-tree: LIMIT_MIB: got '$limit', expected an integer" >&2; exit 2; }
cd "$root"
git ls-files -z | python3 -c '
import collections, os, sys, tarfile
limit = int(sys.argv[1])
files = [f.decode() for f in sys.stdin.buffer.read().split(b"\0") if f]
sizes = {f: os.path.getsize(f) for f in files if os.path.isfile(f)}
total = sum(sizes.values())
by_dir = collections.Counter()
for f, n in sizes.items():
    parts = f.split("/")
    if parts[:2] == ["bench", "results"] and len(parts) > 3:
        by_dir["/".join(parts[:3])] += n
print("check-tree: %d tracked files, %.1f MiB (limit %d MiB)" % (len(sizes), total / 2**20, limit))
for d, n in by_dir.most_common(5):
    print("  %7.2f MiB  %s" % (n / 2**20, d))
plots = []
for f in files:
    if f.endswith(".tar.xz") and f in sizes:
        with tarfile.open(f) as t:
            plots += [f"{f}: {m}" for m in t.getnames() if m.endswith((".png", ".svg"))]
if plots:
    sys.exit("check-tree: plots in raw archives (draw them again from the runs instead; "
             "bench/results/README.md):\n  " + "\n  ".join(plots))
if total > limit * 2**20:
    sys.exit("check-tree: the tracked tree is %.1f MiB, over %d MiB; pack raw experiment output into "
             "one archive per experiment (bench/results/README.md)" % (total / 2**20, limit))
' "$limit"

#!/bin/sh
# A profile DB (WAL mode, as every DB the tools write) on a read-only file system (a read-only
# bind mount in a private mount namespace): inspect, export and cupcake-plan search read it
# (SQLite's immutable mode; before, each said "unable to open database file"), an import into
# it says the file system is read-only, and the DB is left as it was. Skips (exit 77) where the
# machine refuses mount namespaces.
# Usage: read_only_test.sh CUPCAKE_PROFILE CUPCAKE_PLAN PROFILE_JSON MODEL_JSON
set -u
profile_bin="$1" plan_bin="$2" profile="$3" model="$4"
dir=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$dir" "$out"' EXIT
if ! unshare -m sh -c "mount --bind '$dir' '$dir' && mount -o remount,ro,bind '$dir'" 2>"$out/why"; then
  echo "SKIP: cannot make a read-only bind mount in a private mount namespace (needs root and unshare): $(cat "$out/why")"
  exit 77
fi
"$profile_bin" import --db "$dir/p.db" "$profile" >/dev/null || { echo "FAIL: import"; exit 1; }
"$profile_bin" import --db "$dir/p.db" "$model" >/dev/null || { echo "FAIL: import model"; exit 1; }
before=$(cksum <"$dir/p.db")
unshare -m sh -c "
  mount --bind '$dir' '$dir' && mount -o remount,ro,bind '$dir' || exit 3
  '$profile_bin' inspect --db '$dir/p.db' >'$out/inspect' 2>&1; echo \$? >'$out/inspect-rc'
  '$profile_bin' export --db '$dir/p.db' --model resnet50 >'$out/export' 2>&1; echo \$? >'$out/export-rc'
  '$plan_bin' search --model-name resnet50 --profile '$dir/p.db' --compressor topk -o '$out/plan.pb' \
    >'$out/search' 2>&1; echo \$? >'$out/search-rc'
  '$profile_bin' import --db '$dir/p.db' '$model' --replace >'$out/import' 2>&1; echo \$? >'$out/import-rc'
"
fail() { echo "FAIL: $*"; exit 1; }
for step in inspect export search; do
  [ "$(cat "$out/$step-rc")" = 0 ] || fail "$step of a DB on a read-only file system exited $(cat "$out/$step-rc"): $(cat "$out/$step")"
done
grep -q "cluster v100-8x8-pcie-25g" "$out/inspect" || fail "inspect: $(cat "$out/inspect")"
[ "$(cat "$out/import-rc")" = 1 ] || fail "import into it exited $(cat "$out/import-rc"), expected 1"
grep -q "p.db: on a read-only file system" "$out/import" || fail "import: $(cat "$out/import")"
[ "$(cksum <"$dir/p.db")" = "$before" ] || fail "the DB changed"
echo "PASS: a WAL-mode DB on a read-only file system is read by inspect, export and search; import refuses it"

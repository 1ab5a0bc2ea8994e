#!/usr/bin/env bash
# Same-run A/B on one GPU (from the repository root, after scripts/bundle): `host bench` with
# each PTX of bundle/ptx/*.ptx in turn (TOGA_PTX_FILE), ROUNDS times alternated, so drift hits
# every build alike. Logs to $OUT/ab-<build>-<round>.log; a median table per build at the end.
. scripts/variants.inc
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for p in $(variants "$b"); do
    v=$(variant "$p")
    TOGA_PTX_FILE=$p timeout -s KILL "${LIMIT:-90}" "$b/host" bench ${ARGS:-} >"$out/ab-$v-$r.log" 2>&1
    echo "=== $v round $r rc=$?"
  done
done
for p in $(variants "$b"); do
  v=$(variant "$p"); echo "##### $v"; cat "$out"/ab-"$v"-1.log | grep -E "^ *[0-9]" | head -8
done

#!/usr/bin/env python3
"""Summarize an ncu source-page CSV (scripts/gpu-hotspots.sh writes sass-*.csv): stall samples
by reason and by opcode, then the hottest SASS instructions with their execution counts and
top stall reasons. Usage: scripts/ncu-hotspots.py sass-toga_free-16.csv [TOP]"""
import collections
import csv
import sys


def main(path, top):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[head]
    data = [r for r in rows[head + 1:] if len(r) == len(names)]
    col = {k: i for i, k in enumerate(names)}
    samples = col["Warp Stall Sampling (All Samples)"]
    stalls = [c for c in names if c.startswith("stall_") and "Not Issued" not in c]
    value = lambda r, c: float(r[col[c]] or 0)
    total = sum(float(r[samples] or 0) for r in data)
    print(f"{path}: {total:.0f} stall samples over {len(data)} instructions")
    by_reason = collections.Counter({c[6:]: sum(value(r, c) for r in data) for c in stalls})
    print("by reason:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(8)))
    by_op = collections.Counter()
    for r in data:
        words = [w for w in r[col["Source"]].split() if not w.startswith("@")]
        by_op[words[0].split(".")[0] if words else "?"] += float(r[samples] or 0)
    print("by opcode:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_op.most_common(10)))
    for r in sorted(data, key=lambda r: -float(r[samples] or 0))[:top]:
        reasons = sorted(((value(r, c), c[6:]) for c in stalls), reverse=True)[:2]
        print(f"{r[0][-6:]} {100 * float(r[samples] or 0) / total:5.1f}%  {r[col['Source']][:56]:56}"
              f" exec={r[col['Instructions Executed']]:>8}  " + " ".join(f"{n}:{v:.0f}" for v, n in reasons if v))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)

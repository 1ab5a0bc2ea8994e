#!/usr/bin/env python3
"""Stall reasons per function of an ncu source-page CSV (as scripts/ncu-functions.py, which
maps the CSV's addresses to functions): for each of the hottest functions its share of the
stall samples, its instruction count, the warp instructions it executed and its top four
stall reasons (each as a share of all samples).

Usage: scripts/ncu-reasons.py k.sass KERNEL sass-KERNEL.csv"""
import collections
import csv
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location(
    "nf", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ncu-functions.py"))
nf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nf)


def main(sass, kernel, path):
    ins = nf.functions(sass, kernel)
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    col = {k: i for i, k in enumerate(rows[head])}
    data = [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    base = int(data[0][0], 16)
    reasons = [k for k in col if k.startswith("stall_") and "Not Issued" not in k]
    per, tot = collections.defaultdict(collections.Counter), collections.Counter()
    size, executed = collections.Counter(), collections.Counter()
    for r in data:
        f = nf.short(ins.get(int(r[0], 16) - base, ("?", ""))[0])
        size[f] += 1
        executed[f] += int(r[col["Instructions Executed"]] or 0)
        for k in reasons:
            v = float(r[col[k]] or 0)
            per[f][k] += v
            tot[k] += v
    total = sum(tot.values())
    print("total", total, {k[6:]: round(100 * v / total, 1) for k, v in tot.most_common(6)})
    for f, c in sorted(per.items(), key=lambda x: -sum(x[1].values()))[:14]:
        share = 100 * sum(c.values()) / total
        top = " ".join(f"{k[6:]}={100 * v / total:.1f}" for k, v in c.most_common(4))
        print(f"{share:5.1f}% instrs={size[f]:5d} exec={executed[f]:10d} {f[:60]:60} {top}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])

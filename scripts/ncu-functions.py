#!/usr/bin/env python3
"""Attribute an ncu source-page CSV (scripts/gpu-hotspots.sh with KEEP_SASS=1 writes
sass-*.csv) to the functions of its kernel: stall samples per function, and per function the
executions of the costly opcodes (fences, atomics, L1 invalidations, sleeps).

The CSV has addresses but no function names. The names come from disassembling the same PTX
here: `ptxas -arch=sm_90 toga_kernels.ptx -o k.cubin` and `nvdisasm -c k.cubin > k.sass`
(nvdisasm: `pip download nvidia-cuda-nvdisasm`, unpack the wheel). A kernel's section holds its
callees; offsets from the kernel's first instruction match the CSV's addresses from its first
row. The script checks that every opcode matches and says how many did not.

Usage: scripts/ncu-functions.py k.sass KERNEL sass-KERNEL.csv [FUNCTION-SUBSTRING [TOP]]
With a function substring, it also lists that function's hottest instructions by offset."""
import collections
import csv
import re
import sys

COSTLY = ("ERRBAR", "MEMBAR", "ATOM", "ATOMG", "RED", "CCTL", "NANOSLEEP")


def opcode(text):
    words = [w for w in text.split() if not w.startswith("@")]
    return words[0] if words else ""


def functions(sass, kernel):
    """offset -> (function, instruction text) for the kernel's section."""
    out, func, inside = {}, kernel, False
    for line in open(sass):
        if line.startswith(".text."):
            inside = line.strip() == f".text.{kernel}:"
            continue
        if not inside:
            continue
        m = re.match(r"^\$" + re.escape(kernel) + r"\$(\S+):", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        if m:
            out[int(m.group(1), 16)] = (func, m.group(2))
    return out


def short(name):
    return re.sub(r"^_RNv\w*?\d+toga_kernels", "", name)[:72]


def main(sass, kernel, path, want=None, top=25):
    ins = functions(sass, kernel)
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    col = {k: i for i, k in enumerate(rows[head])}
    data = [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    base = int(data[0][0], 16)
    samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    per_func, calls, costly = collections.Counter(), {}, collections.defaultdict(collections.Counter)
    mismatched, total, listed = 0, 0.0, []
    for r in data:
        off = int(r[0], 16) - base
        func, text = ins.get(off, ("?", ""))
        op = opcode(r[col["Source"]])
        mismatched += op != opcode(text)
        s, e = float(r[samples] or 0), int(r[executed] or 0)
        total += s
        per_func[func] += s
        calls.setdefault(func, e)  # executions of the function's first instruction
        if op.split(".")[0] in COSTLY:
            costly[func][op.split(".")[0]] += e
        if want and want in func:
            listed.append((off, s, e, r[col["Source"]].strip()))
    print(f"{path}: {total:.0f} stall samples; opcodes that differ from the disassembly: {mismatched}")
    for func, s in per_func.most_common(16):
        extra = " ".join(f"{k}={v}" for k, v in costly[func].most_common(6) if v)
        print(f"{100 * s / total:5.1f}%  entered {calls.get(func, 0):8d}  {short(func):72}  {extra}")
    for off, s, e, text in sorted(sorted(listed, key=lambda x: -x[1])[:top]):
        print(f"{off:6x} {100 * s / total:5.1f}% exec={e:8d} {text[:80]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3:
        sys.exit(__doc__)
    main(*args[:4], *(int(a) for a in args[4:5]))

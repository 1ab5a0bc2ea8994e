#!/usr/bin/env python3
"""merge_ptx.py USER.ptx TOGA.ptx OUT.ptx

A measurement tool, not a supported way to build (docs/cpp.md, "Speed"): the PTX of a CUDA C++
translation unit compiled without -rdc (nvcc -ptx), with toga's device functions
(toga_device.ptx) put into it, so that one ptxas run compiles the user's kernels and toga's
code as one whole program. ptxas then calls toga's functions without the separate-compilation
ABI (no callee-saved registers to store and reload on every call), as it does in Rust kernels.

The user's `.extern .func` declarations of functions that toga defines are dropped, and toga's
functions go right after the user's header (PTX needs declarations before calls); toga's own
header (.version, .target, .address_size) is dropped, so the user's PTX version and target hold.
"""
import re
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[0])
    user_path, toga_path, out_path = sys.argv[1:4]
    user = open(user_path).read()
    toga = open(toga_path).read()
    defined = set(re.findall(r'^\.visible \.func\s+(?:\([^)]*\)\s*)?(\w+)', toga, re.M))
    if 'toga_malloc' not in defined:
        sys.exit(f'merge_ptx: {toga_path} defines no toga_malloc')

    def drop(m):
        return '' if m.group(2) in defined else m.group(0)

    user = re.sub(r'^\.extern \.func\s+(\([^)]*\)\s*)?(\w+)[^;]*;', drop, user, flags=re.M | re.S)
    toga = re.sub(r'^\s*\.(version|target|address_size)\b.*$', '', toga, flags=re.M)
    header = re.search(r'^\.address_size\s+64\s*$', user, re.M)
    if header is None:
        sys.exit(f'merge_ptx: no .address_size 64 in {user_path}')
    with open(out_path, 'w') as f:
        f.write(user[:header.end()])
        f.write('\n// ---- toga_device.ptx ----\n')
        f.write(toga)
        f.write('\n// ---- ' + user_path + ' ----\n')
        f.write(user[header.end():])


if __name__ == '__main__':
    main()

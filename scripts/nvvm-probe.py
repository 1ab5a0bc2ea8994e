#!/usr/bin/env python3
"""Can libNVVM read toga's device code? A probe for the C++ path's speed (docs/cpp.md, "Speed").

A C++ kernel reaches toga_malloc through a call into separately compiled device code, which
costs it a saved register set per call; the Rust kernels inline the allocator. nvcc inlines
across files only with link-time optimization (-dlto), whose inputs are NVVM IR. This script
builds the kernel crate with the `capi` feature to LLVM IR (rustc's own), hands it to the
libNVVM of the pip wheel nvidia-cuda-nvcc, and prints what each architecture's compile says:

  as built         the IR as rustc wrote it;
  modern dialect   with the `nvvmir.version` metadata and NVVM's data layout, which CUDA 13's
                   "modern" NVVM IR dialect (compute_100 and newer) asks for.

Usage (from the repository root, with the nightly toolchain and `pip install
nvidia-cuda-nvcc`): python3 scripts/nvvm-probe.py [ARCH ...]   (default: compute_90 compute_100)
Exit status: 0 when every compile was tried (whatever it said), 1 when the probe could not run.
"""

import ctypes
import glob
import os
import subprocess
import sys

TARGET = "nvptx64-nvidia-cuda"
OUT_DIR = os.path.join("target", "nvvm-probe")
# The data layout the modern dialect's nvptx64 target wants (from its own error message).
NVVM_DATALAYOUT = (
    "e-p:64:64:64-p6:32:32:32-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128"
    "-f32:32:32-f64:64:64-f128:128:128-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
    "-a:8:8"
)
# NVVM IR 2.0, debug metadata 3.2: the versions this libNVVM reports (nvvmIRVersion).
VERSION_METADATA = "\n!nvvmir.version = !{!90000}\n!90000 = !{i32 2, i32 0, i32 3, i32 2}\n"


def fail(message):
    print(f"nvvm-probe: {message}", file=sys.stderr)
    sys.exit(1)


def libnvvm():
    try:
        import nvidia  # the pip wheels' namespace package
    except ImportError:
        fail("no `nvidia` package: pip install nvidia-cuda-nvcc")
    for root in nvidia.__path__:
        found = sorted(glob.glob(os.path.join(root, "cu*", "lib", "libnvvm.so*")))
        if found:
            return ctypes.CDLL(found[-1]), found[-1]
    fail("libnvvm.so not found in the nvidia wheels: pip install nvidia-cuda-nvcc")


def build_ir():
    """The kernel crate with `capi`, as one LLVM IR module (fat LTO), in OUT_DIR."""
    flags = "\x1f".join(["-Ctarget-cpu=sm_70", "-Cdebuginfo=0", "-Cembed-bitcode=yes"])
    cmd = [
        "cargo", "rustc", "--release", "--lib", "--crate-type", "cdylib",
        "--manifest-path", "kernels/Cargo.toml", "--target", TARGET,
        "--target-dir", OUT_DIR, "-Zbuild-std=core", "--features", "capi",
        "--", "--emit=llvm-ir", "-Clto=fat",
    ]
    env = dict(os.environ, CARGO_ENCODED_RUSTFLAGS=flags)
    env.pop("RUSTFLAGS", None)
    # The link step after the IR fails without the bitcode linker; the IR is written before.
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ll = os.path.join(OUT_DIR, TARGET, "release", "deps", "toga_kernels.ll")
    if not os.path.exists(ll):
        fail(f"rustc wrote no {ll}: run `{' '.join(cmd)}` to see why")
    with open(ll) as f:
        return f.read()


def modern(ir):
    lines = [
        f'target datalayout = "{NVVM_DATALAYOUT}"' if l.startswith("target datalayout") else l
        for l in ir.splitlines()
    ]
    return "\n".join(lines) + VERSION_METADATA


def compile_ir(lib, ir, arch):
    """(result name, first lines of the log) of compiling `ir` for `arch`."""
    lib.nvvmGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    lib.nvvmCreateProgram(ctypes.byref(prog))
    data = ir.encode()
    lib.nvvmAddModuleToProgram(prog, data, ctypes.c_size_t(len(data)), b"toga")
    opts = (ctypes.c_char_p * 1)(f"-arch={arch}".encode())
    rc = lib.nvvmCompileProgram(prog, 1, opts)
    size = ctypes.c_size_t()
    lib.nvvmGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvvmGetProgramLog(prog, log)
    lib.nvvmDestroyProgram(ctypes.byref(prog))
    text = " ".join(log.value.decode(errors="replace").split())
    return lib.nvvmGetErrorString(rc).decode(), text[:300]


def main():
    archs = sys.argv[1:] or ["compute_90", "compute_100"]
    lib, path = libnvvm()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvvmVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"libNVVM {major.value}.{minor.value} ({path})")
    ir = build_ir()
    producer = subprocess.run(["rustc", "-vV"], capture_output=True, text=True).stdout
    llvm = [l for l in producer.splitlines() if l.startswith("LLVM version")]
    print(f"toga's IR: {len(ir)} bytes from rustc ({llvm[0] if llvm else 'LLVM ?'})")
    for arch in archs:
        for name, text in (("as built", ir), ("modern dialect", modern(ir))):
            result, log = compile_ir(lib, text, arch)
            print(f"{arch:>12}  {name:<15} {result}  {log}")


if __name__ == "__main__":
    main()

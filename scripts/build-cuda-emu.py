#!/usr/bin/env python3
"""Builds the CPU emulation of the CUDA driver and cuBLAS into
target/cuda-emu/ (libcuda.so, libcublas.so): kernels/*.cu compiled as host
C++ against tests/cuda_emu/runtime.h, with tests/cuda_emu/{driver,cublas}.cpp.

    python3 scripts/build-cuda-emu.py
    LD_LIBRARY_PATH=$PWD/target/cuda-emu cargo test --release --test library cuda::

Only for tests: it runs the real kernels' code on the CPU, so a launcher
that passes the wrong arguments, geometry or buffer sizes fails here.
"""
import concurrent.futures
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "tests", "cuda_emu")
KERNELS = os.path.join(ROOT, "kernels")
OUT = os.path.join(ROOT, "target", "cuda-emu")
SRC = os.path.join(OUT, "src")
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-ffp-contract=off", "-g0", "-Wall",
         "-Wno-unknown-pragmas", "-Wno-unused-function", "-Wno-unused-variable", "-pthread"]


def family_headers(name):
    """The text the host places before a family's file (src/device/nvrtc.rs)."""
    return ["common.cuh", name + ".cu"]


def kernel_names(name, files):
    """Entry points of a family: its preprocessed text, __global__ kept."""
    src = "".join('#include "%s"\n' % os.path.join(KERNELS, f) for f in files)
    pre = subprocess.run(
        [CXX, "-std=c++17", "-E", "-P", "-x", "c++", "-DFG_SCAN",
         "-include", os.path.join(EMU, "runtime.h"), "-"],
        input=src, capture_output=True, text=True, check=True).stdout
    return re.findall(r"FG_KERNEL\s+void\s+(\w+)\s*\(", pre)


def translation_unit(name, files, names):
    lines = ['#include "runtime.h"', "namespace fg_%s {" % name]
    lines += ['#include "%s"' % os.path.join(KERNELS, f) for f in files]
    lines.append("static const int fg_registered = (0")
    lines += ["    + FG_EMU_ENTRY(%s)" % n for n in names]
    lines += [");", "}  // namespace", ""]
    return "\n".join(lines)


def newer(target, inputs):
    """Whether `target` exists and is newer than every input."""
    if not os.path.exists(target):
        return False
    t = os.path.getmtime(target)
    return all(os.path.getmtime(i) < t for i in inputs)


def compile_one(src, deps):
    obj = os.path.join(SRC, os.path.basename(src)[:-4] + ".o")
    if newer(obj, [src, os.path.join(EMU, "runtime.h")] + deps):
        return obj
    r = subprocess.run([CXX] + FLAGS + ["-I", EMU, "-c", src, "-o", obj + ".tmp"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("compiling %s failed:\n%s" % (src, r.stderr))
    if r.stderr.strip():
        print(r.stderr, file=sys.stderr)
    os.replace(obj + ".tmp", obj)  # whole files only: two builds may race
    return obj


def main():
    os.makedirs(SRC, exist_ok=True)
    families = sorted(f[:-3] for f in os.listdir(KERNELS) if f.endswith(".cu"))
    seen = {}
    sources = [(os.path.join(EMU, "driver.cpp"), [])]
    for fam in families:
        files = family_headers(fam)
        names = kernel_names(fam, files)
        if not names:
            sys.exit("no kernels found in %s" % fam)
        for n in names:
            if n in seen:
                sys.exit("kernel %s is in both %s and %s" % (n, seen[n], fam))
            seen[n] = fam
        path = os.path.join(SRC, fam + ".cpp")
        text = translation_unit(fam, files, names)
        if not os.path.exists(path) or open(path).read() != text:
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        sources.append((path, [os.path.join(KERNELS, f) for f in files]))
    jobs = int(os.environ.get("JOBS", os.cpu_count() or 2))
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        objs = list(ex.map(lambda s: compile_one(*s), sources))
    # The sonames let a process load these by path and have cudarc's later
    # load by bare name find them (tests/cuda/backend.rs does this).
    cuda = os.path.join(OUT, "libcuda.so")
    if not newer(cuda, objs):
        subprocess.run([CXX, "-shared", "-pthread", "-Wl,-soname,libcuda.so", "-o",
                        cuda + ".tmp"] + objs, check=True)
        os.replace(cuda + ".tmp", cuda)
    blas_src, blas = os.path.join(EMU, "cublas.cpp"), os.path.join(OUT, "libcublas.so")
    if not newer(blas, [blas_src]):
        subprocess.run([CXX] + FLAGS + ["-shared", "-Wl,-soname,libcublas.so", "-o",
                                        blas + ".tmp", blas_src], check=True)
        os.replace(blas + ".tmp", blas)
    print("cuda-emu: %d kernels from %d families -> %s" % (len(seen), len(families), OUT))


if __name__ == "__main__":
    main()

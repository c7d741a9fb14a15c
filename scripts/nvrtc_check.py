#!/usr/bin/env python3
"""Compiles kernel files with NVRTC (no GPU needed) for sm_80 and sm_90 and
prints each kernel's registers, shared memory and spill bytes from the
ptxas log. Exit status 1 on a compile error or any spill.

usage: scripts/nvrtc_check.py [kernels/NAME.cu ...]   (default: every file)
Needs scripts/install-cuda-tools.sh first. The Rust `fusegrad kernels`
command does the same from the binary; this is the quick loop for editing.
"""
import ctypes, glob, os, re, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
lib = ctypes.CDLL(os.path.join(root, "target/cuda-tools/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"))
common = open(os.path.join(root, "kernels/common.cuh")).read()

def compile_one(name, src, arch):
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    assert r == 0, r
    opts = [f"-arch=sm_{arch}", "--std=c++17", "--ptxas-options=-v", "-default-device"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, buf.value.decode(errors="replace")

def main():
    files = sys.argv[1:] or sorted(glob.glob(os.path.join(root, "kernels/*.cu")))
    bad = False
    print(f"{'kernel':<36} {'arch':>5} {'regs':>5} {'smem':>6} {'spill':>6}")
    for f in files:
        src = common + "\n" + open(f).read()
        for arch in (80, 90):
            rc, log = compile_one(os.path.basename(f), src, arch)
            if rc != 0:
                print(f"{f} sm_{arch}: COMPILE ERROR\n{log}")
                bad = True
                continue
            cur = None
            for line in log.splitlines():
                m = re.search(r"Compiling entry function '(\w+)'", line)
                if m:
                    cur = m.group(1); spill = 0
                m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
                if m:
                    spill = int(m.group(1)) + int(m.group(2))
                m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
                if m and cur:
                    regs = int(m.group(1)); smem = int(m.group(2))
                    print(f"{cur:<36} sm_{arch} {regs:>5} {smem:>6} {spill:>6}")
                    bad |= spill > 0
                elif re.search(r"Used (\d+) registers", line) and cur:
                    regs = int(re.search(r"Used (\d+) registers", line).group(1))
                    print(f"{cur:<36} sm_{arch} {regs:>5} {0:>6} {spill:>6}")
                    bad |= spill > 0
    sys.exit(1 if bad else 0)

main()

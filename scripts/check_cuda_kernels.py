#!/usr/bin/env python3
"""Compiles custom CUDA kernel bodies with NVRTC the way MLX's fast::cuda_kernel wraps them.

NVRTC is a host library, so this runs on machines without a GPU (CI). Input: a JSON list of
kernels, each {"name", "header", "inputs": [[name, c_type], ...], "outputs": [[name, c_type]],
"consts": ["using T = __nv_bfloat16;", "constexpr int D = 128;", ...], "body"}. The wrapper
follows MLX's conventions: inputs as `const T*`, `<input>_shape` / `<input>_strides` passed by
value when the body mentions them, then the outputs, the template arguments as lines at the
top of the body. Exit status 1 when any kernel fails, with NVRTC's log.

Usage: check_cuda_kernels.py KERNELS.json NVRTC_DIR   (NVRTC_DIR holds lib/ and include/)

DFLASH_NVRTC_PTX_DIR=DIR also writes each instantiation's PTX to DIR/<index>-<name>.ptx: two
source layouts that preprocess to the same code give the same files (diff -r), so a change
that only moves text between files is shown not to change what runs.
"""
import ctypes
import glob
import json
import os
import sys

PRELUDE = r'''
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda/std/cstdint>
using cuda::std::int32_t;
using cuda::std::int64_t;
namespace mlx { namespace core { namespace cu {
// MLX passes cuda::std::array<int32_t / int64_t, 10>; only operator[] is used.
template <typename V> struct DeviceArray10 {
  V v[10];
  __device__ const V& operator[](int i) const { return v[i]; }
};
using Shape = DeviceArray10<int32_t>;
using Strides = DeviceArray10<int64_t>;
}}}
'''


def wrap(k):
    body = k["body"]
    params = []
    for name, ctype in k["inputs"]:
        params.append(f"const {ctype}* {name}")
        if name + "_shape" in body:
            params.append(f"const __grid_constant__ Shape {name}_shape")
        if name + "_strides" in body:
            params.append(f"const __grid_constant__ Strides {name}_strides")
        if name + "_ndim" in body:
            params.append(f"int {name}_ndim")
    for name, ctype in k["outputs"]:
        params.append(f"{ctype}* {name}")
    consts = "\n".join(k.get("consts") or [])
    return (PRELUDE + k.get("header", "") + "\nnamespace mlx { namespace core { namespace cu {\n"
            "namespace cg = cooperative_groups;\n"
            f"__global__ void custom_kernel_{k['name']}({', '.join(params)}) {{\n{consts}\n{body}\n}}\n"
            "}}}\n")


def main():
    kernels = json.load(open(sys.argv[1]))
    root = sys.argv[2]
    lib = sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so.*")))
    lib = [p for p in lib if "builtins" not in p and ".alt." not in p]
    if not lib:
        sys.exit(f"check_cuda_kernels: no libnvrtc.so.* under {root}/lib")
    # NVRTC dlopens its builtins library by soname; load it first so that lookup finds it.
    for b in sorted(glob.glob(os.path.join(root, "lib", "libnvrtc-builtins.so.*"))):
        if ".alt." not in b:
            ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    nv = ctypes.CDLL(lib[0])
    # DFLASH_NVRTC_SASS=pattern: kernels whose name contains pattern are compiled to sm_90
    # machine code with ptxas's report (registers, spills) printed: register pressure and
    # local-memory spills seen without a GPU.
    sass = os.environ.get("DFLASH_NVRTC_SASS", "")
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"-default-device"]
    for inc in (os.path.join(root, "include"), os.path.join(root, "include", "cccl")):
        if os.path.isdir(inc):  # libcu++ lives under include/cccl in the CUDA 13 wheels
            opts.append(b"-I" + inc.encode())
    failed = 0
    ptx_dir = os.environ.get("DFLASH_NVRTC_PTX_DIR", "")
    if ptx_dir:
        os.makedirs(ptx_dir, exist_ok=True)
    only = os.environ.get("DFLASH_NVRTC_ONLY", "")  # a name substring: check those kernels only
    for i, k in enumerate(kernels):
        if only and only not in k["name"]:
            continue
        prog = ctypes.c_void_p()
        nv.nvrtcCreateProgram(ctypes.byref(prog), wrap(k).encode(), (k["name"] + ".cu").encode(), 0, None, None)
        o = opts
        if sass and sass in k["name"]:
            o = [b"--gpu-architecture=sm_90", b"--ptxas-options=-v"] + opts[1:]
        res = nv.nvrtcCompileProgram(prog, len(o), (ctypes.c_char_p * len(o))(*o))
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetProgramLog(prog, log)
        if res == 0 and ptx_dir and o is opts:
            n = ctypes.c_size_t()
            nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
            ptx = ctypes.create_string_buffer(n.value)
            nv.nvrtcGetPTX(prog, ptx)
            with open(os.path.join(ptx_dir, f"{i:03d}-{k['name']}.ptx"), "wb") as f:
                f.write(ptx.value)
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
        text = log.value.decode(errors="replace").strip()
        status = "ok" if res == 0 else f"FAILED (nvrtc status {res})"
        print(f"{k['name']}: {status}")
        if res != 0:
            failed += 1
            print(text)
        elif o is not opts:
            print("\n".join(l for l in text.splitlines() if "registers" in l or "spill" in l or "stack" in l))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

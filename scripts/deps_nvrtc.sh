#!/usr/bin/env bash
# Installs NVIDIA's runtime compiler (NVRTC) and the CUDA headers from PyPI into
# third_party/nvrtc, so `make check-kernels` can compile our custom CUDA kernels on a
# machine without a GPU (NVRTC is a host library). Idempotent (stamp file).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVRTC_VERSION="${NVRTC_VERSION:-13.0.88}"
CCCL_VERSION="${CCCL_VERSION:-13.0.85}" # libcu++ (<nv/target>, <cuda/std/...>), which cooperative_groups needs
dir="$repo_root/third_party/nvrtc"
stamp="$dir/STAMP"
want="nvidia-cuda-nvrtc==$NVRTC_VERSION nvidia-cuda-runtime==$NVRTC_VERSION nvidia-cuda-cccl==$CCCL_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
fail() { echo "deps_nvrtc: $*" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  -d "$tmp" "nvidia-cuda-nvrtc==$NVRTC_VERSION" "nvidia-cuda-runtime==$NVRTC_VERSION" "nvidia-cuda-cccl==$CCCL_VERSION" ||
  fail "pip download of $want failed"
rm -rf "$dir" && mkdir -p "$tmp/x"
for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x" || fail "unpack $w"; done
cu="$(ls -d "$tmp"/x/nvidia/cu* 2>/dev/null | head -1)"
[ -n "$cu" ] && [ -d "$cu/include" ] && ls "$cu"/lib/libnvrtc.so.* >/dev/null 2>&1 || fail "unexpected wheel layout under $tmp/x/nvidia"
mkdir -p "$dir"
cp -r "$cu/include" "$dir/include"
mkdir -p "$dir/lib" && cp "$cu"/lib/libnvrtc* "$dir/lib/"
echo "$want" > "$stamp"
echo "deps_nvrtc: installed $want into $dir"

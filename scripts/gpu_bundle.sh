#!/usr/bin/env bash
# Builds the bundle that scripts/gpu_run.sh unpacks on a lent GPU machine without network
# (docs/gpu.md): the mlx-cuda-13 runtime in parts that fit a call beside the tree (.gpu/p1,
# .gpu/p1b, …; .gpu/p2 holds the rest), and
# stripped binaries of the current tree (CLI + CUDA-relevant test binaries). The wheel comes
# from PyPI once and is kept in $GPU_CACHE. Usage: bash scripts/gpu_bundle.sh [--bin-only | --mlx-lm | --base REV]
# (--base REV: the CLI of commit REV as .gpu/p2/base.tar.xz, for gpu_run.sh abbin.)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
MLX_VERSION="$(sed -n 's/^MLX_VERSION="\${MLX_VERSION:-\(.*\)}"$/\1/p' scripts/deps_mlx.sh)"
CACHE="${GPU_CACHE:-/tmp/dflash-gpu-cache}"
mkdir -p "$CACHE" .gpu/p1 .gpu/p2
step() { echo "== $*"; }

if [ "${1:-}" = "--mlx-lm" ]; then
  # A third part: mlx and mlx-lm as wheels for the GPU machine's Python 3.12 (stage mlxlm
  # of gpu_run.sh compares our decoding with mlx-lm's there). Only these two: the machine's
  # image already has mlx-lm's dependencies (numpy, transformers, sentencepiece, protobuf,
  # pyyaml, jinja2), and the whole tree of wheels would not fit a call beside the tree.
  step "download mlx and mlx-lm for CPython 3.12, manylinux x86_64"
  rm -rf "$CACHE/pywheels" && mkdir -p "$CACHE/pywheels" .gpu/p3
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 --platform any -d "$CACHE/pywheels" "mlx==$MLX_VERSION" "mlx-lm==0.32.2"
  (cd "$CACHE" && tar -cf "$ROOT/.gpu/p3/pywheels.tar" pywheels)
  du -sh .gpu/p3
  echo "carry [\".gpu/p3\"] with 'bash scripts/gpu_run.sh mlxlm' right after a p2 call (docs/gpu.md)"
  exit 0
fi

if [ "${1:-}" = "--base" ]; then
  REV="${2:?--base needs a revision}"
  step "build the CLI of $REV into .gpu/p2/base.tar.xz (stage abbin)"
  W="$(mktemp -d)"
  git worktree add --detach "$W/src" "$REV" > /dev/null
  ln -s "$ROOT/third_party" "$W/src/third_party"
  (cd "$W/src" && make lib > /dev/null && mkdir -p "$W/bin/bin" &&
    CGO_LDFLAGS="-L$ROOT/third_party/tokenizers -L$ROOT/third_party/llguidance" go build -ldflags "-s -w -X github.com/dflash-mlx/dflash-mlx/cli.Version=base-$(git rev-parse --short HEAD)" -o "$W/bin/bin/dflash-base" ./cmd/dflash-mlx)
  (cd "$W/bin" && tar -cJf "$ROOT/.gpu/p2/base.tar.xz" bin)
  git worktree remove --force "$W/src"
  rm -rf "$W"
  exit 0
fi

if [ "${1:-}" != "--bin-only" ]; then
  if [ ! -f "$CACHE/libmlx.so.xz" ]; then
    step "download mlx-cuda-13==$MLX_VERSION"
    python3 -m pip download --quiet --no-deps "mlx-cuda-13==$MLX_VERSION" -d "$CACHE/wheel"
    rm -rf "$CACHE/unpacked" && mkdir -p "$CACHE/unpacked"
    python3 -m zipfile -e "$CACHE"/wheel/mlx_cuda_13-*.whl "$CACHE/unpacked"
    step "compress libmlx.so (xz -9, about 2 minutes)"
    xz -9 -T0 -k -c "$CACHE/unpacked/mlx/lib/libmlx.so" > "$CACHE/libmlx.so.xz.tmp"
    mv "$CACHE/libmlx.so.xz.tmp" "$CACHE/libmlx.so.xz"
  fi
  # Every call carries the working tree too (tracked and untracked files), and all of it
  # must stay under 64 MiB: the runtime goes in parts of PART_MB, one folder each (.gpu/p1,
  # .gpu/p1b, .gpu/p1c, …, each carried with `gpu_run.sh setup`), and .gpu/p2 lists them
  # (libmlx.parts) so that a stage knows when it has them all.
  TREE_MB=$(( $( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) / 1048576 ))
  PART_MB="${GPU_PART_MB:-$(( 60 - TREE_MB ))}"
  [ "$PART_MB" -ge 8 ] || { echo "the tree takes ${TREE_MB} MiB of a call's 64: no room for the runtime's parts" >&2; exit 1; }
  step "split the runtime into parts of ${PART_MB} MiB (the tree takes ${TREE_MB} MiB of each call)"
  rm -rf .gpu/p1 .gpu/p1? && mkdir -p .gpu/p1
  rm -f .gpu/p2/libmlx.so.xz.part-* .gpu/p2/libmlx.parts
  (cd "$CACHE" && rm -f libmlx.so.xz.part-* && split -b "${PART_MB}m" libmlx.so.xz libmlx.so.xz.part-)
  dirs=(p1 p1b p1c p1d p1e p1f p1g p1h)
  i=0
  for part in "$CACHE"/libmlx.so.xz.part-*; do
    [ "$i" -lt "${#dirs[@]}" ] || { echo "more than ${#dirs[@]} runtime parts: raise GPU_PART_MB" >&2; exit 1; }
    mkdir -p ".gpu/${dirs[$i]}" && cp "$part" ".gpu/${dirs[$i]}/"
    basename "$part" >> .gpu/p2/libmlx.parts
    i=$((i + 1))
  done
  (cd "$CACHE/unpacked/mlx" && tar -cJf "$ROOT/.gpu/p2/include.tar.xz" include)
  (cd "$CACHE/unpacked" && tar -cJf "$ROOT/.gpu/p2/libs.tar.xz" mlx_cuda_13.libs)
  (cd third_party && tar -cJf "$ROOT/.gpu/p2/testdata.tar.xz" testdata/qwen3)
  # CUDA's crt/ headers (crt/mma.h): MLX's quantized-matmul kernels include <mma.h>, and the
  # nvidia-cuda-nvrtc/runtime wheels of a typical Python install lack crt/.
  if [ ! -f "$CACHE/crt.tar.xz" ]; then
    python3 -m pip download --quiet --no-deps "nvidia-cuda-crt==13.0.88" -d "$CACHE/crt"
    rm -rf "$CACHE/crt/x" && python3 -m zipfile -e "$CACHE"/crt/nvidia_cuda_crt-*.whl "$CACHE/crt/x"
    (cd "$CACHE/crt/x/nvidia/cu13/include" && tar -cJf "$CACHE/crt.tar.xz" crt)
  fi
  cp "$CACHE/crt.tar.xz" .gpu/p2/
fi

step "build stripped binaries of $(git rev-parse --short HEAD)"
export CGO_LDFLAGS="-L$ROOT/third_party/tokenizers -L$ROOT/third_party/llguidance -Wl,--export-dynamic-symbol=nvrtc*"
B="$(mktemp -d)"
mkdir -p "$B/bin"
go build -ldflags "-s -w -X github.com/dflash-mlx/dflash-mlx/cli.Version=$(git rev-parse --short HEAD)" -o "$B/bin/dflash-mlx" ./cmd/dflash-mlx
# A package's test binary is bin/<package path>.test (gpu_run.sh's diag stage runs it from
# the package's folder).
for p in mlxc model model/deltanet model/qwen35 draft engine verify; do
  mkdir -p "$(dirname "$B/bin/$p.test")"
  go test -c -ldflags "-s -w" -o "$B/bin/$p.test" "./$p"
done
(cd "$B" && tar -cJf "$ROOT/.gpu/p2/bin.tar.xz" bin)
rm -rf "$B"
du -sh .gpu/p1* .gpu/p2
echo "carry each of $(cd .gpu && echo p1*) with 'bash scripts/gpu_run.sh setup' (one call each), then [\".gpu/p2\"] with a stage (docs/gpu.md)"

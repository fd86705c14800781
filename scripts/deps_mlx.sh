#!/usr/bin/env bash
# Installs MLX's backend wheel (libmlx + headers + CMake config) into third_party/mlx.
# Idempotent: a stamp file records the backend and version that are installed.
#   MLX_BACKEND=cpu|cuda|metal   (default: metal on macOS, cpu elsewhere)
#   MLX_WHEEL=/path/to/file.whl | /path/to/dir-with-wheel-or-parts   (offline install)
set -euo pipefail
MLX_VERSION="${MLX_VERSION:-0.32.4}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/third_party/mlx"
if [ -z "${MLX_BACKEND:-}" ]; then
  case "$(uname -s)" in Darwin) MLX_BACKEND=metal ;; *) MLX_BACKEND=cpu ;; esac
fi
case "$MLX_BACKEND" in
  cpu) PKG=mlx-cpu ;; cuda) PKG=mlx-cuda-13 ;; metal) PKG=mlx-metal ;;
  *) echo "deps_mlx: unknown MLX_BACKEND=$MLX_BACKEND (want cpu, cuda or metal)" >&2; exit 2 ;;
esac
STAMP="$DEST/.installed"
WANT="$PKG==$MLX_VERSION"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$DEST/include/mlx/version.h" ]; then
  echo "deps_mlx: $WANT already installed"; exit 0
fi
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
WHEEL=""
if [ -n "${MLX_WHEEL:-}" ]; then
  if [ -d "$MLX_WHEEL" ]; then
    # A folder holds either a wheel or its split parts (name.whl.part-aa, -ab, ...).
    WHEEL="$(ls "$MLX_WHEEL"/*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$WHEEL" ]; then
      first="$(ls "$MLX_WHEEL"/*.whl.part-* 2>/dev/null | head -n1 || true)"
      [ -n "$first" ] || { echo "deps_mlx: no .whl or .whl.part-* in $MLX_WHEEL" >&2; exit 1; }
      WHEEL="$TMP/$(basename "${first%.part-*}")"
      cat "${first%.part-*}".part-* > "$WHEEL"
    fi
  else
    WHEEL="$MLX_WHEEL"
  fi
  [ -f "$WHEEL" ] || { echo "deps_mlx: MLX_WHEEL=$MLX_WHEEL: not found" >&2; exit 1; }
else
  echo "deps_mlx: downloading $WANT"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$TMP" "$WANT" \
    || { echo "deps_mlx: pip download $WANT failed (no network? set MLX_WHEEL=/path/to/wheel)" >&2; exit 1; }
  WHEEL="$(ls "$TMP"/*.whl | head -n1)"
fi
echo "deps_mlx: unpacking $(basename "$WHEEL")"
mkdir -p "$TMP/x"
python3 -m zipfile -e "$WHEEL" "$TMP/x" || { echo "deps_mlx: cannot unpack $WHEEL" >&2; exit 1; }
[ -f "$TMP/x/mlx/include/mlx/version.h" ] || { echo "deps_mlx: $WHEEL has no mlx/include (not a backend wheel?)" >&2; exit 1; }
rm -rf "$DEST.new" && mkdir -p "$DEST.new"
cp -a "$TMP/x/mlx/." "$DEST.new/"
# The wheel's vendored libraries (BLAS/LAPACK) sit beside mlx/ as <pkg>.libs; libmlx's RPATH expects ../../<pkg>.libs.
for d in "$TMP"/x/*.libs; do [ -d "$d" ] && cp -a "$d" "$ROOT/third_party/"; done
chmod -R u+w "$DEST.new"
echo "$WANT" > "$DEST.new/.installed"
rm -rf "$DEST" && mv "$DEST.new" "$DEST"
echo "deps_mlx: installed $WANT into third_party/mlx"

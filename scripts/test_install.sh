#!/usr/bin/env bash
# Checks where dflash-mlx binaries find libmlx (run by `make test`; `make test-install` alone):
#   - `make install` into a temporary PREFIX: the binary's RUNPATH is only its own relative
#     path, and it loads the installed libmlx while the checkout's exists, also once the
#     installed tree has moved;
#   - bin/dflash-mlx: RUNPATH is the checkout's lib, then the lib beside it as in a checkout;
#   - with the checkout's lib hidden (a private mount namespace, where the system allows one):
#     the installed binary still runs on its own libmlx, and a copy of the checkout's binary
#     and libraries moved elsewhere runs on the moved libmlx;
#   - the reverse: with the installed tree gone, bin/dflash-mlx runs on the checkout's.
# The loaded library is what `dflash-mlx version --json` reads from /proc/self/maps.
# Linux only: macOS would read LC_RPATH with `otool -l` (installed: only
# @loader_path/../lib/dflash-mlx/mlx/lib) and see the loaded dylib with DYLD_PRINT_LIBRARIES=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)

if [[ $(uname -s) != Linux ]]; then
  echo "test_install: skipped (Linux only; see the comment at the top for macOS)"
  exit 0
fi
command -v readelf >/dev/null || { echo "test_install: readelf (binutils) is required" >&2; exit 1; }

fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
runpath() { readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p'; }
libmlx() { "$1" version --json | sed -n 's/.*"mlx_library": "\(.*\)".*/\1/p'; }
expect_lib() { # binary, folder its libmlx must come from
  local got
  got=$(libmlx "$1") || fail "$1 does not run: $(libmlx "$1" 2>&1 | tail -1)"
  [[ $(dirname "$got") == "$2" ]] || fail "$1 loaded '$got', want it from $2"
}

tmp=$(mktemp -d)
tmp=$(cd "$tmp" && pwd -P)
trap 'rm -rf "$tmp"' EXIT

# Installed: its own relative path only, its own library, wherever the tree is.
"${MAKE:-make}" -s install PREFIX="$tmp/prefix" >/dev/null
rp=$(runpath "$tmp/prefix/bin/dflash-mlx")
# shellcheck disable=SC2016 # $ORIGIN is the loader's, not the shell's
[[ $rp == '$ORIGIN/../lib/dflash-mlx/mlx/lib' ]] || fail "installed RUNPATH is '$rp', want only \$ORIGIN/../lib/dflash-mlx/mlx/lib"
expect_lib "$tmp/prefix/bin/dflash-mlx" "$tmp/prefix/lib/dflash-mlx/mlx/lib"
mv "$tmp/prefix" "$tmp/moved"
expect_lib "$tmp/moved/bin/dflash-mlx" "$tmp/moved/lib/dflash-mlx/mlx/lib"

# The checkout's binary: the checkout first, then beside itself.
IFS=: read -r first second rest <<<"$(runpath bin/dflash-mlx)"
[[ -d $first && $(cd "$first" && pwd -P) == "$root/third_party/mlx/lib" ]] || fail "bin/dflash-mlx RUNPATH starts with '$first', want the checkout's lib"
# shellcheck disable=SC2016
[[ $second == '$ORIGIN/../third_party/mlx/lib' && -z $rest ]] || fail "bin/dflash-mlx RUNPATH goes on with '$second${rest:+:$rest}', want only \$ORIGIN/../third_party/mlx/lib"
expect_lib bin/dflash-mlx "$root/third_party/mlx/lib"

# A moved checkout: its binary and libraries elsewhere, laid out as in the checkout.
mkdir -p "$tmp/checkout/bin" "$tmp/checkout/third_party/mlx"
cp bin/dflash-mlx "$tmp/checkout/bin/"
cp -a third_party/mlx/lib "$tmp/checkout/third_party/mlx/"
for d in third_party/mlx_*.libs; do [[ -d $d ]] && cp -a "$d" "$tmp/checkout/third_party/"; done

# With the checkout's lib hidden: the installed binary and the moved checkout's still run,
# each on its own libmlx.
hidden() {
  unshare --user --map-root-user --mount bash -c '
    set -e
    mount -t tmpfs none "$1/third_party/mlx/lib"
    shift
    "$@"' _ "$root" "$@"
}
if hidden true 2>/dev/null; then
  export -f fail libmlx expect_lib
  hidden bash -c 'expect_lib "$1/moved/bin/dflash-mlx" "$1/moved/lib/dflash-mlx/mlx/lib"' _ "$tmp"
  hidden bash -c 'expect_lib "$1/checkout/bin/dflash-mlx" "$1/checkout/third_party/mlx/lib"' _ "$tmp"
  # The checkout's own binary has nothing left to load: the hiding works.
  hidden bash -c '! "$1/bin/dflash-mlx" version >/dev/null 2>&1' _ "$root" || fail "bin/dflash-mlx still runs with the checkout's lib hidden: the hiding did not work"
  echo "test_install: checked with the checkout's libmlx hidden"
else
  echo "test_install: no private mount namespace here (unshare); the runs with the checkout's libmlx hidden are skipped"
fi

# The reverse: no installed tree, and the checkout's binary is unaffected.
rm -rf "$tmp/moved"
expect_lib bin/dflash-mlx "$root/third_party/mlx/lib"
echo "test_install: ok (installed binaries use only their own libmlx; the checkout's binary prefers the checkout's)"

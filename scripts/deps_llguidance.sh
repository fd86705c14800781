#!/usr/bin/env bash
# Builds libllguidance.a, the static library of the llguidance crate (constrained
# decoding: JSON schema, Lark grammars, regex), from the pinned crates.io release,
# and installs it with its C header into third_party/llguidance/. Idempotent: a
# stamp file records the crate version and the build recipe, and a matching stamp
# skips the build. Needs cargo (Rust >= 1.87) and crates.io, nothing else.
#
# The grammar package finds the header and the library through ${SRCDIR}; the
# Makefile also exports
#   CGO_LDFLAGS="-L<repo>/third_party/llguidance"
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
crate="llguidance"
version="1.9.1"
install_dir="$repo_root/third_party/llguidance"
lib="$install_dir/libllguidance.a"
header="$install_dir/llguidance.h"
stamp="$install_dir/STAMP"

# The crate ships its Cargo.lock, so the build is --locked to the exact
# dependency versions of the release. Bump this recipe tag whenever the build
# recipe changes.
recipe="profile=release;locked;default-features"
want_stamp="$crate@$version $recipe"

step=""
fail() {
	echo "deps_llguidance: step '$step' failed: $*" >&2
	step="" # reported; the EXIT trap need not repeat it
	exit 1
}
trap 'rc=$?; if [ $rc -ne 0 ] && [ -n "$step" ]; then echo "deps_llguidance: step \"$step\" failed (exit $rc)" >&2; fi' EXIT

if [ -f "$lib" ] && [ -f "$header" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ]; then
	echo "deps_llguidance: $lib is up to date ($crate@$version)"
	trap - EXIT
	exit 0
fi

step="check tools"
command -v cargo >/dev/null 2>&1 || fail "'cargo' is not on PATH (install a Rust toolchain, 1.87 or later)"

work="$(mktemp -d "${TMPDIR:-/tmp}/dflash-llguidance.XXXXXX")"
trap 'rc=$?; rm -rf "$work"; if [ $rc -ne 0 ] && [ -n "$step" ]; then echo "deps_llguidance: step \"$step\" failed (exit $rc)" >&2; fi' EXIT

# cargo downloads (and checks against the registry index) a crate only as a
# dependency, so a throwaway package that depends on the pinned version fetches it
# into cargo's registry cache; cargo metadata then says where it was unpacked.
step="fetch $crate@$version from crates.io"
mkdir -p "$work/fetch"
cat >"$work/fetch/Cargo.toml" <<EOF
[package]
name = "dflash-llguidance-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
path = "lib.rs"

[dependencies]
$crate = "=$version"

[workspace]
EOF
: >"$work/fetch/lib.rs"
(cd "$work/fetch" && cargo fetch) || fail "cargo fetch of $crate@$version (is crates.io reachable?)"

step="locate the unpacked $crate@$version"
metadata="$(cd "$work/fetch" && cargo metadata --format-version 1 --offline)" ||
	fail "cargo metadata in $work/fetch"
manifest="$(printf '%s' "$metadata" | grep -o "\"manifest_path\":\"[^\"]*/$crate-$version/Cargo.toml\"" | head -n 1 | sed 's/^"manifest_path":"//; s/"$//')"
[ -n "$manifest" ] && [ -f "$manifest" ] || fail "no $crate-$version/Cargo.toml in cargo metadata's output"
src="$(dirname "$manifest")"
for f in Cargo.lock llguidance.h; do
	[ -f "$src/$f" ] || fail "$src/$f is missing (the published crate should ship it)"
done

# Build outside cargo's registry cache, whose sources must stay as downloaded.
step="copy the crate to a writable directory"
cp -R "$src" "$work/src" || fail "cp $src -> $work/src"
chmod -R u+w "$work/src"

step="cargo build --release --lib --locked"
echo "deps_llguidance: building libllguidance.a for $crate@$version (about a minute on two cores)"
(cd "$work/src" && cargo build --release --lib --locked --target-dir "$work/target") ||
	fail "cargo build in $work/src (see the cargo output above; llguidance needs Rust 1.87 or later)"
built="$work/target/release/libllguidance.a"
[ -f "$built" ] || fail "cargo finished but $built is missing"

step="install into $install_dir"
mkdir -p "$install_dir"
# Copy then rename so a concurrent build never links a half-written archive; the
# stamp goes last, so an interrupted install is redone.
rm -f "$stamp"
cp "$built" "$lib.tmp.$$" && mv -f "$lib.tmp.$$" "$lib" || fail "copy $built -> $lib"
cp "$work/src/llguidance.h" "$header.tmp.$$" && mv -f "$header.tmp.$$" "$header" || fail "copy llguidance.h -> $header"
if [ -f "$work/src/LICENSE" ]; then
	cp "$work/src/LICENSE" "$install_dir/LICENSE" || fail "copy LICENSE"
fi
printf '%s\n' "$want_stamp" >"$stamp.tmp.$$" && mv -f "$stamp.tmp.$$" "$stamp" || fail "write $stamp"
echo "deps_llguidance: installed $lib and $header ($crate@$version)"
step=""

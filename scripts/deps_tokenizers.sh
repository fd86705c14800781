#!/usr/bin/env bash
# Builds libtokenizers.a, the Rust half of github.com/daulet/tokenizers, from the
# source inside the Go module pinned in go.mod, and installs it into
# third_party/tokenizers/. Idempotent: a stamp file records the module version
# and the build recipe, and a matching stamp skips the build.
#
# Link the Go package against it with:
#   CGO_LDFLAGS="-L<repo>/third_party/tokenizers"
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="github.com/daulet/tokenizers"
install_dir="$repo_root/third_party/tokenizers"
lib="$install_dir/libtokenizers.a"
stamp="$install_dir/STAMP"

# The module's Cargo.toml pulls tiktoken-rs from a git branch, and only package
# registries are reachable here. tiktoken-rs 0.7.0 on crates.io has the same
# CoreBPE API (new/encode/decode, rustc-hash 1.x maps); the branch only bumps
# fancy-regex. Bump this recipe tag whenever the build recipe changes.
tiktoken_crate_version="0.7.0"
recipe="tiktoken-rs=${tiktoken_crate_version};profile=release"

step=""
fail() {
	echo "deps_tokenizers: step '$step' failed: $*" >&2
	step="" # reported; the EXIT trap need not repeat it
	exit 1
}
trap 'rc=$?; if [ $rc -ne 0 ] && [ -n "$step" ]; then echo "deps_tokenizers: step \"$step\" failed (exit $rc)" >&2; fi' EXIT

step="check tools"
for tool in go cargo; do
	command -v "$tool" >/dev/null 2>&1 || fail "'$tool' is not on PATH (install Go and a Rust toolchain)"
done

step="read pinned version from go.mod"
cd "$repo_root"
version="$(go list -m -f '{{.Version}}' "$module" 2>&1)" ||
	fail "go list -m $module: $version (is $module required in go.mod?)"
[ -n "$version" ] || fail "$module has no version in go.mod"
want_stamp="$module@$version $recipe"

if [ -f "$lib" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ]; then
	echo "deps_tokenizers: $lib is up to date ($module@$version)"
	trap - EXIT
	exit 0
fi

step="download $module@$version"
go mod download "$module" || fail "go mod download $module"
src="$(go list -m -f '{{.Dir}}' "$module")"
[ -n "$src" ] && [ -f "$src/Cargo.toml" ] || fail "no Cargo.toml in module dir '$src'"

step="copy Rust source to a writable directory"
work="$(mktemp -d "${TMPDIR:-/tmp}/dflash-tokenizers.XXXXXX")"
trap 'rc=$?; rm -rf "$work"; if [ $rc -ne 0 ] && [ -n "$step" ]; then echo "deps_tokenizers: step \"$step\" failed (exit $rc)" >&2; fi' EXIT
cp -R "$src/." "$work/" || fail "cp $src -> $work"
chmod -R u+w "$work"

step="point tiktoken-rs at crates.io"
if grep -q '^tiktoken-rs *= *{ *git' "$work/Cargo.toml"; then
	sed -i.orig "s|^tiktoken-rs *= *{ *git.*|tiktoken-rs = \"=${tiktoken_crate_version}\"|" "$work/Cargo.toml" ||
		fail "sed on Cargo.toml"
	grep -q "^tiktoken-rs = \"=${tiktoken_crate_version}\"" "$work/Cargo.toml" ||
		fail "Cargo.toml was not rewritten as expected"
fi

step="cargo build --release"
echo "deps_tokenizers: building libtokenizers.a for $module@$version (takes a few minutes)"
(cd "$work" && cargo build --release --lib) || fail "cargo build in $work (see the cargo output above)"
built="$work/target/release/libtokenizers.a"
[ -f "$built" ] || fail "cargo finished but $built is missing"

step="install into $install_dir"
mkdir -p "$install_dir"
# Copy then rename so a concurrent build never links a half-written archive.
cp "$built" "$lib.tmp.$$" && mv -f "$lib.tmp.$$" "$lib" || fail "copy $built -> $lib"
printf '%s\n' "$want_stamp" >"$stamp.tmp.$$" && mv -f "$stamp.tmp.$$" "$stamp" || fail "write $stamp"
echo "deps_tokenizers: installed $lib ($module@$version)"
step=""

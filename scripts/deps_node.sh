#!/usr/bin/env bash
# Installs the npm packages the tests use (the official `openai` and `@anthropic-ai/sdk` SDKs
# and the Vercel AI SDK, `ai` with `@ai-sdk/openai`, for the server's SDK tests) from the
# committed package-lock.json. Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
D="$ROOT/server/sdktest"
if [ -f "$D/node_modules/.package-lock.json" ] && cmp -s "$D/package-lock.json" "$D/node_modules/.lock-stamp" 2>/dev/null; then
  echo "deps_node: up to date"; exit 0
fi
command -v npm >/dev/null || { echo "deps_node: npm is not on PATH" >&2; exit 1; }
(cd "$D" && npm ci --no-audit --no-fund --loglevel=error) || { echo "deps_node: npm ci in server/sdktest failed" >&2; exit 1; }
cp "$D/package-lock.json" "$D/node_modules/.lock-stamp"
echo "deps_node: installed server/sdktest packages"

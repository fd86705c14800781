#!/usr/bin/env bash
# Creates the Python reference environment third_party/pyref used only by tests and
# reference benchmarks (mlx-lm parity, tokenizer/template parity, Hub cache interop,
# the OpenAI and Anthropic SDKs). The engine itself never needs Python. Idempotent via a
# stamp file.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/third_party/pyref"
PKGS=(
  "mlx==0.32.4" "mlx-lm==0.32.2" "tokenizers==0.23.3" "transformers==5.24.0"
  "jinja2==3.1.6" "huggingface_hub==2.4.0" "openai==3.57.0" "anthropic==2.16.0" "safetensors==0.8.0"
  "numpy==2.4.6" "pillow==13.0.0" "requests==2.34.2"
)
# The reference runs on the CPU backend on Linux (same MLX version as ours); on macOS the
# mlx wheel brings mlx-metal.
if [ "$(uname -s)" = Linux ]; then PKGS+=("mlx-cpu==0.32.4"); fi
# Installed after PKGS with --no-deps: z-lab's DFlash reference (dflash.model_mlx) imports only
# mlx, mlx-lm and huggingface_hub; its declared requirements (tqdm, datasets, requests) are not used.
# mlx-vlm's Qwen3.5 MTP drafter (the MTP head's reference, model/qwen35/testdata/mtp_ref.py)
# needs, past mlx and transformers, only pillow and requests (in PKGS) at import; its audio,
# video and server requirements are not used.
NODEPS=("dflash==0.1.0" "mlx-vlm==0.7.10")
STAMP="$VENV/.installed"
WANT="${PKGS[*]} --no-deps ${NODEPS[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "deps_pyref: reference venv up to date"; exit 0
fi
# An existing venv is updated in place (pip leaves satisfied pins alone and adds or changes
# the rest), so a list change does not tear down a venv that tests may be using.
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "deps_pyref: updating $VENV"
else
  echo "deps_pyref: creating $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || { echo "deps_pyref: python3 -m venv failed (install python3-venv)" >&2; exit 1; }
fi
"$VENV/bin/pip" install -q --disable-pip-version-check "${PKGS[@]}" \
  || { echo "deps_pyref: pip install of the reference packages failed" >&2; exit 1; }
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "${NODEPS[@]}" \
  || { echo "deps_pyref: pip install --no-deps ${NODEPS[*]} failed" >&2; exit 1; }
echo "$WANT" > "$STAMP"
echo "deps_pyref: installed ${#PKGS[@]} pinned packages and ${#NODEPS[@]} without dependencies"

"""Reference computations with mlx-lm for the Go parity tests (model package).

  convert SRC DST BITS GROUP     quantize an HF-layout checkpoint into the mlx-community layout
                                 with mlx-lm's own quantize_model / save_model / save_config
  ref DIR OUT TOKENS GREEDY_N    load DIR with mlx-lm (strict) and write to OUT (safetensors):
                                   logits   [L, V] float32 of one causal forward over TOKENS
                                   hidden_i [L, H] float32 residual output of layer i
                                   greedy   [GREEDY_N] int32 from generate_step (prefill chunking,
                                            last prompt token alone, argmax sampler)
                                 TOKENS is a comma-separated list of ids.
"""
import json
import os
import sys
from pathlib import Path

import mlx.core as mx

# The device the Go side computes on: DFLASH_DEVICE=cpu|gpu as mlxc reads it, else MLX's
# default (the GPU where there is one), as mlxc picks. Set before mlx_lm is imported, whose
# generation stream is made on the default device at import.
_device = os.environ.get("DFLASH_DEVICE", "").lower()
if _device in ("cpu", "gpu"):
    mx.set_default_device(mx.cpu if _device == "cpu" else mx.gpu)

# On the CPU the MoE experts' products run as the Go side runs them there (float32 casts).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "internal" / "reftest"))
import mlx_cpu_gather  # noqa: E402

mlx_cpu_gather.patch_on_cpu()

from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.base import create_attention_mask  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import load_model, quantize_model, save_config, save_model  # noqa: E402


def convert(src, dst, bits, group):
    model, config = load_model(Path(src), lazy=True)
    model, config = quantize_model(model, config, group, bits)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=False)
    save_model(dst, model, donate_model=True)
    save_config(config, config_path=dst / "config.json")


def ref(d, out, tokens, greedy_n):
    model, _ = load_model(Path(d), strict=True)
    toks = mx.array(tokens, dtype=mx.int32)
    inner = model.model
    cache = make_prompt_cache(model)
    h = inner.embed_tokens(toks[None])
    mask = create_attention_mask(h, cache[0])
    res = {}
    for i, (layer, c) in enumerate(zip(inner.layers, cache)):
        h = layer(h, mask, c)
        res[f"hidden_{i}"] = h[0].astype(mx.float32)
    out_h = inner.norm(h)
    if model.args.tie_word_embeddings:
        logits = inner.embed_tokens.as_linear(out_h)
    else:
        logits = model.lm_head(out_h)
    res["logits"] = logits[0].astype(mx.float32)
    full = model(toks[None])  # the library's own forward must agree with the layer loop
    res["logits_model"] = full[0].astype(mx.float32)
    if greedy_n > 0:
        gen = []
        for tok, _ in generate_step(toks, model, max_tokens=greedy_n):
            gen.append(int(tok))
        res["greedy"] = mx.array(gen, dtype=mx.int32)
    mx.save_safetensors(out, res)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "convert":
        convert(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "ref":
        ref(sys.argv[2], sys.argv[3], [int(t) for t in sys.argv[4].split(",")], int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown command {cmd}")

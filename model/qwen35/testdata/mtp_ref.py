"""Reference steps of the Qwen3.5 multi-token-prediction head for the Go parity tests.

The head is mlx-vlm's Qwen3_5MTPDraftModel (mlx_vlm.speculative.drafters.qwen3_5_mtp: its
sanitize, fc over the concatenated pre-fc norms, decoder layer, final norm and KV cache),
bound to the target as mlx-lm loads it (the target's embedding and LM head, and the
target's final-normed hidden rows as the head's input).

  ref DIR OUT TOKENS BONUS STEPS ROLLBACK LAYER
      TOKENS: comma-separated prompt ids t[0..P-1]; BONUS: the token after them.
      LAYER:  mlxvlm    the head exactly as mlx-vlm builds it;
              mlxlm     mlx-vlm's head with its decoder layer built by mlx-lm (DecoderLayer with
                        full_attention_interval 1, the target's own layer code), whose RoPE
                        and products run as the target's do.
      Writes to OUT (safetensors, float32 unless said):
        target_hidden  [P, H]   the target's final-normed rows of one forward over TOKENS
        prefill_hidden [P, H], prefill_logits [P, V]
                                one head step over the pairs (t[i+1], h[i]), t[P] = BONUS
        step_tokens    [STEPS] int32, the argmax of the previous logits' last row
        step_I_hidden  [1, H], step_I_logits [1, V]
                                step I over (step_tokens[I], the previous step's last row)
        rollback_logits [1, V], rollback_hidden [1, H]
                                after dropping the last ROLLBACK slots, one step over
                                (BONUS, target_hidden[P-1])
"""
import dataclasses
import json
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

_device = os.environ.get("DFLASH_DEVICE", "").lower()
if _device in ("cpu", "gpu"):
    mx.set_default_device(mx.cpu if _device == "cpu" else mx.gpu)

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "internal" / "reftest"))
import mlx_cpu_gather  # noqa: E402

mlx_cpu_gather.patch_on_cpu()

from mlx_lm.models.qwen3_5 import DecoderLayer as MLXLMDecoderLayer  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from mlx_vlm.speculative.drafters.qwen3_5_mtp import ModelConfig, Qwen3_5MTPDraftModel  # noqa: E402


class _MLXLMLayer(MLXLMDecoderLayer):
    """mlx-lm's decoder layer under mlx-vlm's call: RoPE at the cache's offset, which is the
    slot index mlx-vlm passes as position_ids."""

    def __call__(self, x, mask=None, cache=None, position_ids=None):
        return super().__call__(x, mask, cache)


def mtp_weights(d):
    """The checkpoint's MTP tensors as mlx-vlm's drafter loads them: raw HF names mtp.* go
    through its sanitize (prefix stripped, norms shifted, fused experts split); an MLX
    conversion's language_model.mtp.* lose their prefix only (mlx-vlm's MLX-source path)."""
    out = {}
    raw = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            if k.startswith("mtp."):
                raw[k] = v
            elif k.startswith("language_model.mtp."):
                out[k[len("language_model.mtp."):]] = v
    if raw and out:
        raise SystemExit("both mtp.* and language_model.mtp.* tensors")
    return Qwen3_5MTPDraftModel.sanitize(None, raw) if raw else out


def quantize_like(d, weights, cfg):
    q = cfg.get("quantization")
    if not q:
        return
    over = {k[len("language_model.mtp."):]: v for k, v in q.items()
            if isinstance(v, dict) and k.startswith("language_model.mtp.")}

    def pred(path, m):
        if not hasattr(m, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return over.get(path, True)

    nn.quantize(d, group_size=q["group_size"], bits=q["bits"], mode=q.get("mode", "affine"),
                class_predicate=pred)


def ref(d, out, tokens, bonus, steps, rollback, layer):
    cfg = json.loads((Path(d) / "config.json").read_text())
    model, _ = load_model(Path(d), strict=True)
    text = model.language_model
    toks = mx.array(tokens, dtype=mx.int32)[None]
    target_hidden = text.model(toks)  # mlx-lm's text model ends with its final norm

    head = Qwen3_5MTPDraftModel(ModelConfig.from_dict({"text_config": cfg.get("text_config", cfg)}))
    if layer == "mlxlm":
        args = dataclasses.replace(text.args, full_attention_interval=1)
        head.layers = [_MLXLMLayer(args, 0) for _ in head.layers]
    elif layer != "mlxvlm":
        raise SystemExit(f"unknown layer {layer}")
    weights = mtp_weights(d)
    quantize_like(head, weights, cfg)
    head.load_weights(list(weights.items()), strict=True)
    head.reset(model)

    res = {"target_hidden": target_hidden[0]}
    pairs = mx.concatenate([toks[:, 1:], mx.array([[bonus]], dtype=mx.int32)], axis=1)
    h = head._forward_tokens(pairs, target_hidden, mx.int32)
    logits = head._lm_head_fn(h)
    res["prefill_hidden"], res["prefill_logits"] = h[0], logits[0]
    gen = []
    for i in range(steps):
        tok = mx.argmax(logits[:, -1:, :], axis=-1).astype(mx.int32)
        gen.append(int(tok.item()))
        h = head._forward_tokens(tok, h[:, -1:, :], mx.int32)
        logits = head._lm_head_fn(h)
        res[f"step_{i}_hidden"], res[f"step_{i}_logits"] = h[0], logits[0]
    res["step_tokens"] = mx.array(gen, dtype=mx.int32)
    for c in head._cache:
        c.trim(rollback)
    head._next_position -= rollback
    h = head._forward_tokens(mx.array([[bonus]], dtype=mx.int32), target_hidden[:, -1:, :], mx.int32)
    res["rollback_hidden"], res["rollback_logits"] = h[0], head._lm_head_fn(h)[0]
    res = {k: (v if v.dtype == mx.int32 else v.astype(mx.float32)) for k, v in res.items()}
    mx.save_safetensors(out, res)


if __name__ == "__main__":
    if sys.argv[1] != "ref":
        raise SystemExit(f"unknown command {sys.argv[1]}")
    a = sys.argv
    ref(a[2], a[3], [int(t) for t in a[4].split(",")], int(a[5]), int(a[6]), int(a[7]), a[8])

"""Reference values from mlx-lm for the deltanet parity tests.

  ref IN OUT HK HV DK DV K FRESH
    IN holds q, k [B,T,Hk,Dk], v [B,T,Hv,Dv], a, b [B,T,Hv], A_log, dt_bias [Hv],
    state [B,Hv,Dv,Dk] float32, qkv [B,T,C], conv_w [C,K,1], tail [B,K-1,C].
    OUT (safetensors) gets:
      g, beta          mlx-lm's gates (compute_g, sigmoid) of a, b
      y, state_out     gated_delta_ops(q, k, v, g, beta, state): the per-step ops path
      conv, conv_tail  the GatedDeltaNet conv of qkv after tail (silu applied) and the new tail
      mix_y, mix_state, mix_tail
                       qwen3_5.GatedDeltaNet's own forward on the raw projections qkv, a, b,
                       from the cache (tail, state), or from an empty cache when FRESH is 1;
                       mix_y is the recurrence output before the gated norm.
"""
import os
import sys

import mlx.core as mx

_device = os.environ.get("DFLASH_DEVICE", "").lower()
if _device in ("cpu", "gpu"):
    mx.set_default_device(mx.cpu if _device == "cpu" else mx.gpu)

import mlx.nn as nn  # noqa: E402
from mlx_lm.models import gated_delta  # noqa: E402
from mlx_lm.models.cache import ArraysCache  # noqa: E402
from mlx_lm.models.qwen3_5 import GatedDeltaNet, TextModelArgs  # noqa: E402


def mixer(inp, hk, hv, dk, dv, kern, fresh):
    B, T, _ = inp["qkv"].shape
    args = TextModelArgs(
        model_type="qwen3_5_text",
        hidden_size=8,
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=kern,
    )
    layer = GatedDeltaNet(args)
    layer.eval()
    layer.conv1d.weight = inp["conv_w"]
    layer.A_log = inp["A_log"]
    layer.dt_bias = inp["dt_bias"]
    # The projections return the given rows; the gated norm and the output projection are
    # bypassed, so the module's own conv, split, normalisation, gates and recurrence run.
    layer.in_proj_qkv = lambda x: inp["qkv"]
    layer.in_proj_a = lambda x: inp["a"]
    layer.in_proj_b = lambda x: inp["b"]
    layer.in_proj_z = lambda x: mx.zeros((B, T, hv * dv), dtype=inp["qkv"].dtype)
    captured = {}

    def norm(y, z):
        captured["y"] = y
        return y

    layer.norm = norm
    layer.out_proj = lambda x: x
    cache = ArraysCache(size=2)
    if not fresh:
        cache[0] = inp["tail"]
        cache[1] = inp["state"]
    layer(mx.zeros((B, T, 8), dtype=inp["qkv"].dtype), cache=cache)
    return captured["y"], cache[1], cache[0]


def ref(src, dst, hk, hv, dk, dv, kern, fresh):
    inp = mx.load(src)
    out = {}
    g = gated_delta.compute_g(inp["A_log"], inp["a"], inp["dt_bias"])
    beta = mx.sigmoid(inp["b"])
    out["g"], out["beta"] = g, beta
    out["y"], out["state_out"] = gated_delta.gated_delta_ops(inp["q"], inp["k"], inp["v"], g, beta, inp["state"])
    conv = nn.Conv1d(inp["qkv"].shape[-1], inp["qkv"].shape[-1], kern, groups=inp["qkv"].shape[-1], bias=False)
    conv.weight = inp["conv_w"]
    x = mx.concatenate([inp["tail"], inp["qkv"]], axis=1)
    out["conv"] = nn.silu(conv(x))
    out["conv_tail"] = mx.contiguous(x[:, -(kern - 1):, :])
    out["mix_y"], out["mix_state"], out["mix_tail"] = mixer(inp, hk, hv, dk, dv, kern, fresh)
    mx.eval(out)
    mx.save_safetensors(dst, out)


if __name__ == "__main__":
    if len(sys.argv) != 10 or sys.argv[1] != "ref":
        sys.exit(__doc__)
    ref(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:9]), sys.argv[9] == "1")

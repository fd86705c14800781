"""Reference outputs of mlx-lm's sparse MoE blocks for the Go tests of package moe.

  moe_ref.py DIR FAMILY E K H IM IS NORM DTYPE QUANT SEED NS

FAMILY is next (Qwen3NextSparseMoeBlock, also Qwen3.5-MoE's) or moe (Qwen3MoeSparseMoeBlock,
no shared expert, IS ignored). NORM is 0/1 (norm_topk_prob), DTYPE float32|bfloat16, QUANT 0
or 4 (4-bit experts and shared expert, router and shared_expert_gate at 8 bits group 64, as
mlx-lm's quant_predicate for these families writes them), NS a comma-separated list of row
counts. Writes into DIR:
  model.safetensors  the block's weights under model.layers.0.mlp.
  config.json        the "quantization" block (when QUANT is 4)
  ref.safetensors    x_N [N,H] input; y_N the block's output in DTYPE; and for bfloat16
                     dense experts on the CPU (where MLX's gather_mm refuses bfloat16) y_N is the
                     block with gather_mm cast to float32 and back, and y32_N / agree_N are
                     the whole block in float32 and, per row, 1 where its chosen experts
                     equal the bfloat16 block's.
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import os

import mlx.core as mx

# The device the Go side computes on (DFLASH_DEVICE=cpu|gpu, as mlxc reads it).
_gpu = os.environ.get("DFLASH_DEVICE", "cpu").lower() == "gpu"
mx.set_default_device(mx.gpu if _gpu else mx.cpu)

import mlx.nn as nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "internal" / "reftest"))
import mlx_cpu_gather  # noqa: E402
from mlx.utils import tree_flatten, tree_map  # noqa: E402
from mlx_lm.models.qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402
from mlx_lm.models.qwen3_next import Qwen3NextSparseMoeBlock  # noqa: E402

PREFIX = "model.layers.0.mlp."


def build(family, E, K, H, IM, IS, norm):
    a = SimpleNamespace(hidden_size=H, moe_intermediate_size=IM, shared_expert_intermediate_size=IS,
                        norm_topk_prob=norm, num_experts=E, num_experts_per_tok=K)
    return Qwen3NextSparseMoeBlock(a) if family == "next" else Qwen3MoeSparseMoeBlock(a)


def chosen(block, x):
    g = mx.softmax(block.gate(x), axis=-1, precise=True)
    k = block.top_k
    return mx.sort(mx.argpartition(g, kth=-k, axis=-1)[..., -k:], axis=-1)


def main():
    d, family, E, K, H, IM, IS, norm, dtype, quant, seed, ns = sys.argv[1:]
    E, K, H, IM, IS, quant, seed = map(int, (E, K, H, IM, IS, quant, seed))
    norm = norm == "1"
    dt = getattr(mx, dtype)
    ns = [int(n) for n in ns.split(",")]
    mx.random.seed(seed)
    block = build(family, E, K, H, IM, IS, norm)
    # A router wider than the default init makes routing decisive, so that float32 and
    # bfloat16 mostly pick the same experts.
    block.gate.weight = mx.random.normal(block.gate.weight.shape) * (3.0 / H**0.5)
    block.update(tree_map(lambda p: p.astype(dt), block.parameters()))
    qcfg = None
    if quant:
        def pred(path, m):
            if path == "gate" or path == "shared_expert_gate":
                return {"group_size": 64, "bits": 8}
            return hasattr(m, "to_quantized") and m.weight.shape[-1] % 64 == 0
        qcfg = {"group_size": 64, "bits": quant, "mode": "affine"}
        for path, m in block.named_modules():
            if path in ("gate", "shared_expert_gate"):
                qcfg[PREFIX + path] = {"group_size": 64, "bits": 8}
        nn.quantize(block, group_size=64, bits=quant, class_predicate=pred)
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    weights = {PREFIX + k: v for k, v in tree_flatten(block.parameters())}
    mx.save_safetensors(str(d / "model.safetensors"), weights)
    cfg = {"quantization": qcfg} if qcfg else {}
    (d / "config.json").write_text(json.dumps(cfg))

    patched = dt != mx.float32 and not quant and not _gpu
    block32 = None
    if patched:
        block32 = build(family, E, K, H, IM, IS, norm)
        block32.update(tree_map(lambda p: p.astype(mx.float32), block.parameters()))
        orig = mx.gather_mm
        gather_mm_f32 = mlx_cpu_gather.float32_gather_mm(orig)

    out = {}
    for n in ns:
        x = mx.random.normal((n, H)).astype(dt)
        out[f"x_{n}"] = x
        if patched:
            mx.gather_mm = gather_mm_f32
            out[f"y_{n}"] = block(x)
            mx.eval(out[f"y_{n}"])
            mx.gather_mm = orig
            x32 = x.astype(mx.float32)
            out[f"y32_{n}"] = block32(x32)
            out[f"agree_{n}"] = mx.all(chosen(block, x) == chosen(block32, x32), axis=-1).astype(mx.int32)
        else:
            out[f"y_{n}"] = block(x)
        mx.eval(out)
    mx.save_safetensors(str(d / "ref.safetensors"), out)
    print("ok")


main()

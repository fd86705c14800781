"""What the pair's trainers share: the device, the token streams, and a PyTorch DFlash drafter
in z-lab's checkpoint layout (the engine's draft package reads it; its math is
../shared/design/DFLASH.md §3, the same as the engine's draft.Drafter)."""

import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MASK_TOKEN = 3  # train/tokenizer.py's <|mask|>


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    # bf16 on the GPU; float32 on the CPU, where bf16 matrix products are slow.
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def load_tokens(path):
    arr = np.load(path)
    if arr.dtype != np.uint16 or arr.ndim != 1:
        raise SystemExit(f"{path}: want a 1-D uint16 token stream, got {arr.dtype} {arr.shape}")
    return torch.from_numpy(arr.astype(np.int64))


def windows(stream, n, length, gen):
    """n random windows of length tokens from stream (a 1-D tensor), as [n, length]."""
    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def rms_norm(x, w, eps):
    # As Qwen3's RMSNorm: float32 statistics, the weight applied in the input's type.
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(positions, head_dim, theta, dtype):
    """cos and sin [*, P, head_dim] for positions [*, P] (non-traditional: halves rotate)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate(x, cos, sin):
    """x [B, heads, P, D] with cos, sin [B, P, D]."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos[:, None] + rot * sin[:, None]


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh, nkv, hd, I = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
        self.nh, self.nkv, self.hd, self.eps = nh, nkv, hd, c["rms_norm_eps"]
        self.input_layernorm = nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = nn.Parameter(torch.ones(H))
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def heads(self, x, n):
        B, P, _ = x.shape
        return x.view(B, P, n, self.hd).transpose(1, 2)

    def forward(self, x, ctx, ctx_rope, blk_rope, mask):
        """x: block rows [B, R, H]; ctx: projected context [B, T, H]; mask [B, 1, R, T+R] (True: seen)."""
        h = rms_norm(x, self.input_layernorm, self.eps)
        q = rotate(rms_norm(self.heads(self.q_proj(h), self.nh), self.q_norm, self.eps), *blk_rope)
        kc = rotate(rms_norm(self.heads(self.k_proj(ctx), self.nkv), self.k_norm, self.eps), *ctx_rope)
        kb = rotate(rms_norm(self.heads(self.k_proj(h), self.nkv), self.k_norm, self.eps), *blk_rope)
        k = torch.cat([kc, kb], 2)
        v = torch.cat([self.heads(self.v_proj(ctx), self.nkv), self.heads(self.v_proj(h), self.nkv)], 2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5)
        x = x + self.o_proj(a.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        h = rms_norm(x, self.post_attention_layernorm, self.eps)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Drafter(nn.Module):
    """A DFlash drafter: fc + hidden_norm project the target's tapped hidden rows; its layers
    read them as extra keys and values while denoising blocks [anchor, mask, …, mask]; the
    target's embedding and head (not trained here) turn tokens into rows and rows into logits."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        H, n = c["hidden_size"], len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(H))
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = nn.Parameter(torch.ones(H))

    def forward(self, taps, anchors, tokens, embed, block):
        """Logits [B, N, block−1, V] for the N blocks of each sequence: taps [B, T, n·H] (the
        target's tapped rows of tokens [B, T]), anchors [B, N] (a block's first position; its
        context is the rows before it)."""
        c, (B, T), N = self.c, tokens.shape, anchors.shape[1]
        eps, dev = c["rms_norm_eps"], tokens.device
        ctx = rms_norm(self.fc(taps), self.hidden_norm, eps)
        slot = torch.arange(block, device=dev)
        pos = (anchors[:, :, None] + slot).reshape(B, N * block)                       # [B, R]
        blk = torch.full((B, N, block), MASK_TOKEN, dtype=torch.long, device=dev)
        blk[:, :, 0] = torch.gather(tokens, 1, anchors)
        x = F.embedding(blk.reshape(B, -1), embed)
        # Context row j is seen by a block iff j < its anchor; a block sees all of itself.
        seen_ctx = torch.arange(T, device=dev)[None, None, :] < anchors.repeat_interleave(block, 1)[:, :, None]
        blk_id = torch.arange(N, device=dev).repeat_interleave(block)
        seen_blk = (blk_id[:, None] == blk_id[None, :]).expand(B, -1, -1)
        mask = torch.cat([seen_ctx, seen_blk], 2)[:, None]
        hd, theta = c["head_dim"], c["rope_theta"]
        ctx_rope = rope_tables(torch.arange(T, device=dev).expand(B, -1), hd, theta, x.dtype)
        blk_rope = rope_tables(pos, hd, theta, x.dtype)
        for layer in self.layers:
            x = layer(x, ctx, ctx_rope, blk_rope, mask)
        h = rms_norm(x, self.norm, eps).view(B, N, block, -1)[:, :, 1:]
        return h @ embed.t()

    def state(self):
        """The weights under z-lab's names (no embedding, no head)."""
        out = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        for i, l in enumerate(self.layers):
            p = f"layers.{i}."
            out[p + "input_layernorm.weight"] = l.input_layernorm
            out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(l, n).weight
            out[p + "self_attn.q_norm.weight"] = l.q_norm
            out[p + "self_attn.k_norm.weight"] = l.k_norm
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(l, n).weight
        return out


def drafter_config(target_cfg, layers, taps, block):
    t = target_cfg
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": t["hidden_size"], "num_hidden_layers": layers,
        "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"], "intermediate_size": t["intermediate_size"], "vocab_size": t["vocab_size"],
        "rms_norm_eps": t["rms_norm_eps"], "rope_theta": t["rope_theta"],
        "max_position_embeddings": t["max_position_embeddings"], "block_size": block,
        "num_target_layers": t["num_hidden_layers"], "tie_word_embeddings": False, "attention_bias": False,
        "dflash_config": {"mask_token_id": MASK_TOKEN, "target_layer_ids": taps},
        "torch_dtype": "bfloat16",
    }


class Clock:
    """Elapsed seconds since construction (the trainers size their step count from it)."""

    def __init__(self):
        self.t0 = time.time()

    def elapsed(self):
        return time.time() - self.t0


def cosine_lr(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)

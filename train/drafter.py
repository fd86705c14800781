"""Trains the pair's DFlash drafter on the target's own hidden states and greedy
continuations, within a time budget, and saves it in z-lab's layout (config.json with
dflash_config, model.safetensors without embedding or head).

The recipe is the DFlash paper's: the target (frozen) continues prompts from the training
stream greedily; on each such sequence, blocks start at random anchor positions in the
continuation, the block's first token is the anchor's and the rest are masks, the block
attends to the target's tapped rows before the anchor and to itself, and the loss on block
slot k (1..block−1) is weighted by exp(−(k−1)/γ), toward the early slots that decide
acceptance. Labels are the target's argmax at each position, so the drafter learns what
the target will verify. Held-out sequences (continuations of held-out prompts) give the
acceptance the drafter reaches: the mean committed tokens a cycle, τ, if every block were
verified from an anchor.

    python3 train/drafter.py --data /tmp/pair/data --target /tmp/pair/target --out /tmp/pair/draft --minutes 5
"""

import argparse
import json
import os
import shutil

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

import pairlib


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--target", required=True, help="target.py's output folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--taps", default="", help="comma-separated target layer ids (default: spread over the target)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0, help="the loss weights' decay over the block's slots")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=448)
    ap.add_argument("--gen-seqs", type=int, default=4096, help="training sequences the target continues")
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--anchors", type=int, default=32, help="blocks per sequence a step")
    ap.add_argument("--batch", type=int, default=32, help="sequences a step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget (generation not counted)")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_args()


def spread_taps(n_target, n):
    """n layer ids spread over a target of n_target layers, from layer 0 to two before the last."""
    last = max(0, n_target - 2)
    return sorted({round(i * last / max(1, n - 1)) for i in range(n)})


@torch.no_grad()
def continue_greedy(target, prompts, gen_len, batch):
    """The target's greedy continuations of prompts [N, P] by gen_len tokens: [N, P+gen_len]."""
    out = []
    for i in range(0, prompts.shape[0], batch):
        x = prompts[i:i + batch]
        past = None
        step_in = x
        seq = [x]
        for _ in range(gen_len):
            o = target(input_ids=step_in, past_key_values=past, use_cache=True)
            past = o.past_key_values
            step_in = o.logits[:, -1].argmax(-1, keepdim=True)
            seq.append(step_in)
        out.append(torch.cat(seq, 1))
    return torch.cat(out)


@torch.no_grad()
def target_pass(target, seqs, taps):
    """The tapped rows [B, T, n·H] (each layer's output residual stream) and the argmax
    labels [B, T] (the target's next token after each position)."""
    o = target(input_ids=seqs, output_hidden_states=True)
    rows = torch.cat([o.hidden_states[i + 1] for i in taps], -1)
    return rows, o.logits.argmax(-1)


def block_loss(drafter, target, seqs, taps, embed, a, gen, weights):
    B, T = seqs.shape
    rows, labels = target_pass(target, seqs, taps)
    # Anchors in the continuation, leaving a whole block of labels after each.
    lo, hi = a.prompt_len, T - a.block
    anchors = torch.stack([torch.randperm(hi - lo, generator=gen)[:a.anchors] + lo for _ in range(B)]).to(seqs.device)
    logits = drafter(rows, anchors, seqs, embed, a.block)                          # [B, N, block−1, V]
    # Slot k predicts the token at anchor+k: the target's argmax after position anchor+k−1.
    idx = anchors[:, :, None] + torch.arange(a.block - 1, device=seqs.device)       # anchor+k−1 for k=1..
    want = torch.gather(labels, 1, idx.flatten(1)).view_as(idx)
    ce = F.cross_entropy(logits.float().flatten(0, 2), want.flatten(), reduction="none").view_as(want)
    loss = (ce * weights).sum() / (weights.sum() * B * a.anchors)
    # Accepted slots: the leading run of right drafts in each block.
    right = (logits.argmax(-1) == want).int()
    accepted = right.cumprod(-1).sum(-1).float()
    return loss, accepted.mean().item() + 1


def main():
    a = parse()
    torch.manual_seed(a.seed)
    dev, dtype = pairlib.pick_device(a.device)
    gen = torch.Generator().manual_seed(a.seed)
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=dtype).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tcfg = json.load(open(os.path.join(a.target, "config.json")))
    tcfg.setdefault("rope_theta", (tcfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    taps = [int(x) for x in a.taps.split(",")] if a.taps else spread_taps(tcfg["num_hidden_layers"], 3)
    if any(t < 0 or t >= tcfg["num_hidden_layers"] for t in taps):
        raise SystemExit(f"drafter: --taps {taps} outside the target's {tcfg['num_hidden_layers']} layers")
    cfg = pairlib.drafter_config(tcfg, a.layers, taps, a.block)
    embed = target.get_input_embeddings().weight

    clock = pairlib.Clock()
    train = pairlib.load_tokens(os.path.join(a.data, "train.npy"))
    held = pairlib.load_tokens(os.path.join(a.data, "heldout.npy"))
    prompts = pairlib.windows(train, a.gen_seqs, a.prompt_len, gen).to(dev)
    seqs = continue_greedy(target, prompts, a.gen_len, a.gen_batch)
    held_seqs = continue_greedy(target, pairlib.windows(held, 64, a.prompt_len, gen).to(dev), a.gen_len, a.gen_batch)
    gen_s = clock.elapsed()
    print(f"drafter: {seqs.shape[0]} continuations of {a.gen_len} tokens in {gen_s:.0f} s; taps {taps}", flush=True)

    drafter = pairlib.Drafter(cfg).to(dev)
    # The drafter starts from the target's layers of the same shape (a warm start the
    # DFlash authors use too), its own fc, norms at one.
    with torch.no_grad():
        for i, l in enumerate(drafter.layers):
            src = target.model.layers[taps[min(i, len(taps) - 1)]]
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(l, n).weight.copy_(getattr(src.self_attn, n).weight)
            for n in ("gate_proj", "up_proj", "down_proj"):
                getattr(l, n).weight.copy_(getattr(src.mlp, n).weight)
            l.q_norm.copy_(src.self_attn.q_norm.weight)
            l.k_norm.copy_(src.self_attn.k_norm.weight)
            l.input_layernorm.copy_(src.input_layernorm.weight)
            l.post_attention_layernorm.copy_(src.post_attention_layernorm.weight)
    master = [p for p in drafter.parameters()]
    opt = torch.optim.AdamW(master, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01, eps=1e-6)
    weights = torch.exp(-torch.arange(a.block - 1, device=dev, dtype=torch.float32) / a.gamma)
    budget = a.minutes * 60
    t0 = clock.elapsed()
    total, step, log = a.max_steps or 10**9, 0, []
    while step < total:
        pick = torch.randint(0, seqs.shape[0], (a.batch,), generator=gen)
        for g in opt.param_groups:
            g["lr"] = pairlib.cosine_lr(step, total if total < 10**9 else 10**6, a.lr, 50)
        # float32 weights, bf16 products on the GPU
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, tau = block_loss(drafter, target, seqs[pick.to(dev)], taps, embed, a, gen, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step()
        step += 1
        if step == 20 and not a.max_steps:
            per = (clock.elapsed() - t0) / step
            total = max(step + 1, int((budget - (clock.elapsed() - t0)) / per) + step)
            print(f"drafter: {per * 1000:.0f} ms a step; {total} steps in the budget", flush=True)
        if step % 50 == 0 or step == total:
            log.append({"step": step, "loss": round(loss.item(), 4), "tau_train": round(tau, 3), "seconds": round(clock.elapsed(), 1)})
            print(f"drafter: step {step}/{total} loss {loss.item():.3f} τ(train) {tau:.2f} ({clock.elapsed():.0f} s)", flush=True)
        if not a.max_steps and clock.elapsed() - t0 > budget * 1.05:
            break
    train_s = clock.elapsed() - t0
    with torch.no_grad(), torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
        taus = [block_loss(drafter, target, held_seqs[i:i + 16], taps, embed, a, gen, weights)[1] for i in range(0, held_seqs.shape[0], 16)]
    tau_held = sum(taus) / len(taus)
    print(f"drafter: held-out τ (every block verified from an anchor) {tau_held:.2f} after {step} steps, {train_s:.0f} s", flush=True)

    tmp = a.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in drafter.state().items()}
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    pairlib.write_json(os.path.join(tmp, "config.json"), cfg)
    pairlib.write_json(os.path.join(tmp, "training.json"), {
        "steps": step, "seconds": round(train_s, 1), "generation_seconds": round(gen_s, 1),
        "sequences": seqs.shape[0], "prompt_len": a.prompt_len, "gen_len": a.gen_len, "anchors": a.anchors,
        "batch": a.batch, "gamma": a.gamma, "lr": a.lr, "taps": taps, "heldout_tau_anchor": round(tau_held, 3),
        "device": str(dev), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
        "torch": torch.__version__, "log": log})
    shutil.rmtree(a.out, ignore_errors=True)
    os.replace(tmp, a.out)
    print(f"drafter: saved {a.out}", flush=True)


if __name__ == "__main__":
    main()

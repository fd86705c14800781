"""Trains the pair's target: a Qwen3-architecture model (transformers' Qwen3ForCausalLM)
on the corpus's training stream, within a time budget, and saves it in the Hugging Face
layout the engine loads (config.json, model.safetensors in bf16, generation_config.json and
the tokenizer files).

    python3 train/target.py --data /tmp/pair/data --tokenizer /tmp/pair/tokenizer \
        --out /tmp/pair/target --minutes 7            # the H200 run
    python3 train/target.py ... --hidden 64 --layers 2 --inter 128 --minutes 2   # a CPU trial
"""

import argparse
import json
import os
import shutil

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import pairlib


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="data.py's output folder")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--inter", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024, help="training window, tokens")
    ap.add_argument("--batch", type=int, default=64, help="windows a step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--minutes", type=float, default=7.0, help="training time budget")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the budget decides)")
    ap.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations (the best is kept)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile (default: on a GPU)")
    return ap.parse_args()


@torch.no_grad()
def heldout_loss(model, stream, seq, dev, dtype, batches=8, batch=16):
    g = torch.Generator().manual_seed(0)
    model.eval()
    total = 0.0
    for _ in range(batches):
        x = pairlib.windows(stream, batch, seq + 1, g).to(dev)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=x[:, :-1]).logits.float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item()
    model.train()
    return total / batches


def main():
    a = parse()
    torch.manual_seed(a.seed)
    dev, dtype = pairlib.pick_device(a.device)
    tok_cfg = json.load(open(os.path.join(a.tokenizer, "tokenizer.json")))
    vocab = max(t["id"] for t in tok_cfg["added_tokens"]) + 1
    vocab = max(vocab, len(tok_cfg["model"]["vocab"]))
    train = pairlib.load_tokens(os.path.join(a.data, "train.npy"))
    held = pairlib.load_tokens(os.path.join(a.data, "heldout.npy"))
    if int(train.max()) >= vocab:
        raise SystemExit(f"target: token id {int(train.max())} is outside the tokenizer's {vocab} (data from another tokenizer?)")
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=a.hidden, intermediate_size=a.inter, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=[2, 0], pad_token_id=0, attention_bias=False, use_sliding_window=False)
    model = Qwen3ForCausalLM(cfg).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"target: {params / 1e6:.2f}M parameters on {dev}, {train.numel()} training tokens", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=dev.type == "cuda")
    step_fn = model
    use_compile = a.compile if a.compile is not None else dev.type == "cuda"
    if use_compile:
        step_fn = torch.compile(model)
    gen = torch.Generator().manual_seed(a.seed)
    clock = pairlib.Clock()
    budget = a.minutes * 60
    total, step, timed_from, log = a.max_steps or 10**9, 0, None, []
    best = (float("inf"), 0, None)  # held-out loss, step, weights: many epochs over a small corpus overfit
    model.train()
    while step < total:
        x = pairlib.windows(train, a.batch, a.seq + 1, gen).to(dev, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = pairlib.cosine_lr(step, total if total < 10**9 else 10**6, a.lr, 100)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
            try:
                logits = step_fn(input_ids=x[:, :-1]).logits
            except Exception as e:  # a compiler failure must not cost the run
                if step_fn is model:
                    raise
                print(f"target: torch.compile failed ({type(e).__name__}: {e}); training eagerly", flush=True)
                step_fn = model
                logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 10:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            timed_from = (step, clock.elapsed())
        if step == 30 and timed_from and not a.max_steps:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per = (clock.elapsed() - timed_from[1]) / (step - timed_from[0])
            total = max(step + 1, int((budget - clock.elapsed()) / per) + step)
            print(f"target: {per * 1000:.1f} ms a step; {total} steps in the budget", flush=True)
        if step % a.eval_every == 0:
            hl = heldout_loss(model, held, min(a.seq, 512), dev, dtype)
            log.append({"step": step, "heldout_loss": round(hl, 4)})
            print(f"target: step {step} held-out loss {hl:.3f}", flush=True)
            if hl < best[0]:
                best = (hl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
        if step % 100 == 0 or step == total:
            log.append({"step": step, "loss": round(loss.item(), 4), "seconds": round(clock.elapsed(), 1)})
            print(f"target: step {step}/{total} loss {loss.item():.3f} ({clock.elapsed():.0f} s)", flush=True)
        if not a.max_steps and clock.elapsed() > budget * 1.05:
            print("target: over the time budget, stopping", flush=True)
            break
    trained_s = clock.elapsed()
    hl = heldout_loss(model, held, min(a.seq, 512), dev, dtype)
    kept = step
    if best[2] is not None and best[0] < hl:
        model.load_state_dict(best[2])
        hl, kept = best[0], best[1]
    print(f"target: held-out loss {hl:.3f} (weights of step {kept} of {step}), {trained_s:.0f} s", flush=True)
    tmp = a.out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), tmp)
    pairlib.write_json(os.path.join(tmp, "training.json"), {
        "parameters": params, "steps": step, "kept_step": kept, "seconds": round(trained_s, 1), "batch": a.batch, "seq": a.seq,
        "tokens_seen": step * a.batch * a.seq, "lr": a.lr, "heldout_loss": round(hl, 4), "device": str(dev),
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None, "torch": torch.__version__, "log": log})
    shutil.rmtree(a.out, ignore_errors=True)
    os.replace(tmp, a.out)
    print(f"target: saved {a.out}", flush=True)


if __name__ == "__main__":
    main()

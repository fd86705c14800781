"""Greedy DFlash, simulated in PyTorch with the trained pair: the target's greedy
continuation of each prompt, and the cycles the engine would run on it (block from the
staged token at the committed length, drafts accepted while they equal the target's
tokens). Its τ must equal what the engine measures on the same prompts (the engine's
greedy output is the target's): a check that the engine reads the drafter as it was
trained. Prints one JSON line per prompt and the mean.

    python3 train/simulate.py --target /tmp/pair/target --draft /tmp/pair/draft --prompt-file p.txt -n 128
"""

import argparse
import json
import os

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

import pairlib


@torch.no_grad()
def simulate(target, drafter, embed, taps, ids, n, block):
    dev = embed.device
    x = torch.tensor([ids], device=dev)
    for _ in range(n):  # the target's greedy continuation, as plain decoding gives it
        x = torch.cat([x, target(input_ids=x).logits[:, -1:].argmax(-1)], 1)
    o = target(input_ids=x, output_hidden_states=True)
    rows = torch.cat([o.hidden_states[i + 1] for i in taps], -1)
    P, end = len(ids), x.shape[1]
    a, hist = P, []  # a: the staged token's position
    while a < end - 1:  # the engine stops once n tokens are out
        logits = drafter(rows, torch.tensor([[a]], device=dev), x, embed, block)
        drafts = logits[0, 0].argmax(-1)
        acc = 0
        while acc < block - 1 and a + 1 + acc < end and int(drafts[acc]) == int(x[0, a + 1 + acc]):
            acc += 1
        hist.append(acc)
        a += acc + 1
    return hist


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompt-file", required=True, help="one JSON string per line, each a raw-completion prompt")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).to(dev).eval()
    cfg = json.load(open(os.path.join(a.draft, "config.json")))
    drafter = pairlib.Drafter(cfg)
    from safetensors.torch import load_file
    w = load_file(os.path.join(a.draft, "model.safetensors"))
    with torch.no_grad():
        for k, p in drafter.state().items():
            p.copy_(w[k].float())
    drafter = drafter.to(dev).eval()
    tok = Tokenizer.from_file(os.path.join(a.target, "tokenizer.json"))
    taps = cfg["dflash_config"]["target_layer_ids"]
    taus = []
    for line in open(a.prompt_file):
        hist = simulate(target, drafter, target.get_input_embeddings().weight, taps, tok.encode(json.loads(line)).ids, a.n, cfg["block_size"])
        # The engine's τ: tokens committed a cycle, the first token (from the prefill) aside.
        tau = (a.n - 1) / len(hist) if hist else 0
        taus.append(tau)
        print(json.dumps({"cycles": len(hist), "tau": round(tau, 3), "accepted": hist}))
    print(json.dumps({"mean_tau": round(sum(taus) / len(taus), 3)}))


if __name__ == "__main__":
    main()

"""Tokenizes the corpus into the token streams the trainers read.

Each file becomes one document, written either as raw code followed by <|endoftext|> or,
for half of the files (chosen by a hash of the path), as a chat turn: the user asks for the
file by its path and the assistant answers with the code, ending in <|im_end|>. So the
target learns both plain completion and the chat template the tokenizer ships.
Writes train.npy and heldout.npy (uint16 token ids, documents back to back) and
heldout_prompts.jsonl: for each held-out file, a completion prompt (its first 96 tokens'
text) and a chat prompt (its path), the prompts the measurements use.

    python3 train/data.py --corpus /tmp/pair/corpus --tokenizer /tmp/pair/tokenizer --out /tmp/pair/data
"""

import argparse
import hashlib
import json
import os

import numpy as np
from tokenizers import Tokenizer

EOT, IM_START, IM_END = 0, 1, 2
PROMPT_TOKENS = 96


def chat_user(path):
    return f"Write the Go file {path}."


def as_chat(path):
    return hashlib.sha256(("chat:" + path).encode()).digest()[0] % 2 == 0


def document(tok, path, text):
    if not as_chat(path):
        return tok.encode(text).ids + [EOT]
    head = tok.encode(f"<|im_start|>user\n{chat_user(path)}<|im_end|>\n<|im_start|>assistant\n").ids
    return head + tok.encode(text).ids + [IM_END] + tok.encode("\n").ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    if tok.get_vocab_size() > 65536:
        raise SystemExit("data: the vocabulary does not fit uint16 ids")
    os.makedirs(a.out, exist_ok=True)
    stats = {}
    for split in ("train", "heldout"):
        docs = [json.loads(l) for l in open(os.path.join(a.corpus, split + ".jsonl"))]
        ids = []
        for d in docs:
            ids.extend(document(tok, d["path"], d["text"]))
        arr = np.asarray(ids, dtype=np.uint16)
        np.save(os.path.join(a.out, split + ".tmp.npy"), arr)
        os.replace(os.path.join(a.out, split + ".tmp.npy"), os.path.join(a.out, split + ".npy"))
        stats[split] = {"documents": len(docs), "tokens": int(arr.size)}
        if split == "heldout":
            with open(os.path.join(a.out, "heldout_prompts.jsonl"), "w") as f:
                for d in docs:
                    enc = tok.encode(d["text"])
                    if len(enc.ids) < 2 * PROMPT_TOKENS:
                        continue
                    # Cut at a token boundary that is also a character boundary.
                    end = enc.offsets[PROMPT_TOKENS - 1][1]
                    f.write(json.dumps({"path": d["path"], "completion": d["text"][:end], "chat": chat_user(d["path"])}) + "\n")
    with open(os.path.join(a.out, "data.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()

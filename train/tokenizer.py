"""Trains the Go-code pair's byte-level BPE tokenizer on the corpus's training split.

Writes tokenizer.json and tokenizer_config.json (with a ChatML-style chat template) into
--out. Special tokens come first, so their ids are fixed: <|endoftext|> 0 (end of a
document, padding), <|im_start|> 1, <|im_end|> 2 (end of an assistant turn), <|mask|> 3 (the
DFlash drafter's mask token).

    python3 train/tokenizer.py --corpus /tmp/pair/corpus --vocab 8192 --out /tmp/pair/tokenizer
"""

import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
EOT, IM_START, IM_END, MASK = range(4)

# One line per message, then the assistant's header when a reply is wanted.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def texts(path):
    with open(path) as f:
        for line in f:
            yield json.loads(line)["text"]


def build(vocab):
    tok = Tokenizer(models.BPE())
    # GPT-2's split (letters, digits, punctuation, spaces apart) before the byte mapping.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    return tok, trainer


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": SPECIAL[IM_END],
        "pad_token": SPECIAL[EOT],
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "rstrip": False, "normalized": False,
                                          "single_word": False, "special": True} for i, s in enumerate(SPECIAL)},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="corpus.py's output folder")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not 4096 <= a.vocab <= 65536:
        raise SystemExit("tokenizer: --vocab must be in 4096..65536 (token ids are stored as uint16)")
    tok, trainer = build(a.vocab)
    tok.train_from_iterator(texts(os.path.join(a.corpus, "train.jsonl")), trainer=trainer)
    for i, s in enumerate(SPECIAL):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"tokenizer: {s} has id {tok.token_to_id(s)}, want {i}")
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=1)
    sample = next(texts(os.path.join(a.corpus, "heldout.jsonl")))
    ids = tok.encode(sample).ids
    assert tok.decode(ids) == sample, "byte-level BPE must round-trip"
    print(json.dumps({"vocab": tok.get_vocab_size(), "heldout_sample_bytes_per_token": round(len(sample.encode()) / len(ids), 2)}))


if __name__ == "__main__":
    main()

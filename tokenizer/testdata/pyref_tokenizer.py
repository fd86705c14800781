"""Reference encodings and decodings from the Python `tokenizers` package.

Used by the Go tests (parity_test.go); not part of the program.

Usage: python pyref_tokenizer.py TOKENIZER_JSON < request.json > response.json

request:  {"encode": ["text", ...], "decode": [[id, ...], ...]}
response: {"encode": [[id, ...], ...],            add_special_tokens=False
           "encode_special": [[id, ...], ...],    add_special_tokens=True
           "decode": ["text", ...],               skip_special_tokens=False
           "decode_skip": ["text", ...]}          skip_special_tokens=True
"""
import json
import sys

from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    req = json.load(sys.stdin)
    texts = req.get("encode", [])
    id_lists = req.get("decode", [])
    resp = {
        "version": __import__("tokenizers").__version__,
        "encode": [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)],
        "encode_special": [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)],
        "decode": [tok.decode(ids, skip_special_tokens=False) for ids in id_lists],
        "decode_skip": [tok.decode(ids, skip_special_tokens=True) for ids in id_lists],
    }
    json.dump(resp, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()

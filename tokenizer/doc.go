// Package tokenizer turns text into token ids and back for Hugging Face style
// model directories, and renders chat conversations into prompts.
//
// It covers four jobs the engine and the server need:
//
//   - Encoding and decoding with the model's own tokenizer.json. Encoding runs
//     in the Rust tokenizers library (github.com/daulet/tokenizers, linked as
//     libtokenizers.a; build it with scripts/deps_tokenizers.sh and point
//     CGO_LDFLAGS at it). Decoding of byte-level BPE vocabularies (Qwen, GPT-2
//     style) is done in Go from the vocabulary, because the C API cannot return
//     text that contains a NUL byte; other decoders go through the library.
//   - The set of end-of-sequence ids, gathered from config.json,
//     generation_config.json and tokenizer_config.json.
//   - A streaming detokenizer (StreamDecoder) that turns ids into text deltas
//     one token at a time, never splits a UTF-8 sequence, and whose deltas
//     concatenate to exactly Decode(all ids).
//   - Chat templates: the model's Jinja chat_template rendered with the same
//     inputs and semantics as transformers' apply_chat_template (sandboxed
//     Jinja with trim_blocks and lstrip_blocks, a Python-compatible tojson,
//     raise_exception, namespace, Python string and dict methods).
//
// Everything is checked against the Python references (tokenizers and
// transformers) on the real Qwen3 tokenizer; see the package tests.
package tokenizer

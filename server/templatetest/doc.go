// Package templatetest checks the server's tool-call handling against real chat templates:
// Qwen3's (JSON calls) and a Qwen3.5-style stand-in (qwen3_coder XML calls), rendered by the
// tokenizer package's Jinja engine, through all three chat APIs. It holds tests only; it is
// a package of its own because rendering links the tokenizer library, which the server's
// own tests do not need.
package templatetest

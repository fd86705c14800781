"""Reference chat-template renderings from `transformers`.

Used by the Go tests (chat_parity_test.go); not part of the program.

Usage: python pyref_chat.py MODEL_DIR < request.json > response.json

request: {"chats": [{"messages": [...], "tools": [...] or null,
                     "add_generation_prompt": bool, "kwargs": {...}}, ...],
          "templates": [{"source": "jinja", "context": {...}}, ...]}

Chats go through AutoTokenizer.from_pretrained(MODEL_DIR).apply_chat_template
(tokenize=False). Templates are compiled in transformers' own chat-template
environment and rendered with the context as keyword arguments. Each result
is {"text": "..."} or {"error": "ExceptionType: message"}.
"""
import json
import sys

import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template


def run(fn):
    try:
        return {"text": fn()}
    except Exception as e:  # the Go side compares failure, not the message
        return {"error": "%s: %s" % (type(e).__name__, e)}


def main():
    req = json.load(sys.stdin)
    resp = {"version": transformers.__version__, "chats": [], "templates": []}
    if req.get("chats"):
        tok = AutoTokenizer.from_pretrained(sys.argv[1])
        for chat in req["chats"]:
            resp["chats"].append(run(lambda: tok.apply_chat_template(
                chat["messages"],
                tools=chat.get("tools"),
                add_generation_prompt=chat.get("add_generation_prompt", False),
                tokenize=False,
                **chat.get("kwargs", {}),
            )))
    for case in req.get("templates", []):
        resp["templates"].append(run(
            lambda: _compile_jinja_template(case["source"]).render(**case["context"])))
    json.dump(resp, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()

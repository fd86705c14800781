"""Reference for sample.Filter and sample.PenaltyRows: mlx-lm's own sampling transforms.

usage: mlxlm_filters.py CASES.json OUT_DIR

CASES.json lists cases {name, rows, vocab, dtype, logits (raw float32 file), op, arg,
history}. For each case the logits are read as float32, cast to dtype, turned into
log-probabilities as mlx-lm's generate_step does (logits - logsumexp, in that dtype), and
the op is applied with mlx_lm.sample_utils:
  top_p / top_k / min_p: the kept set (1 byte a token, 1 = kept) goes to OUT_DIR/NAME.kept;
  penalty: mlx-lm's repetition-penalty processor on the logits (not the log-probabilities)
  with the given history, written as float32 to OUT_DIR/NAME.f32.
"""
import json
import os
import sys

import mlx.core as mx
import numpy as np

# The device the Go side computes on: DFLASH_DEVICE=cpu|gpu as mlxc reads it, else MLX's
# default (the GPU where there is one), as mlxc picks.
_device = os.environ.get("DFLASH_DEVICE", "").lower()
if _device in ("cpu", "gpu"):
    mx.set_default_device(mx.cpu if _device == "cpu" else mx.gpu)

from mlx_lm import sample_utils  # noqa: E402

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


def main():
    cases = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    for c in cases:
        raw = np.fromfile(c["logits"], dtype=np.float32, count=c["rows"] * c["vocab"]).reshape(c["rows"], c["vocab"])
        logits = mx.array(raw).astype(DTYPES[c["dtype"]])
        op, arg = c["op"], c["arg"]
        if op == "penalty":
            proc = sample_utils.make_repetition_penalty(arg, context_size=c.get("context", 20))
            res = proc(mx.array(c["history"]), logits).astype(mx.float32)
            np.array(res).astype(np.float32).tofile(os.path.join(out, c["name"] + ".f32"))
            continue
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if op == "top_p":
            res = sample_utils.apply_top_p(logprobs, arg)
        elif op == "top_k":
            res = sample_utils.apply_top_k(logprobs, int(arg))
        elif op == "min_p":
            # mlx-lm adds log(min_p) to the best log-probability in the array's dtype; the
            # engine filters in float32, so the reference is evaluated in float32 too (the
            # top-p and top-k sets do not depend on that cast: it is exact and monotone).
            res = sample_utils.apply_min_p(logprobs.astype(mx.float32), arg)
        else:
            raise SystemExit(f"unknown op {op}")
        kept = np.array(res.astype(mx.float32)) != -np.inf
        kept.astype(np.uint8).tofile(os.path.join(out, c["name"] + ".kept"))


if __name__ == "__main__":
    main()

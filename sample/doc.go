// Package sample turns logits into tokens: mlx-lm's logits processors (repetition penalty)
// and sampler (top-p, min-p, top-k filters on the log-probabilities, then temperature),
// plus the full distributions speculative sampling needs. Everything stays on the device
// as lazy arrays; randomness uses explicit keys split from a per-request seed, so a seeded
// request is reproducible.
package sample

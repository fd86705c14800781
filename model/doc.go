// Package model holds the target language models: config parsing, safetensors loading
// with validation (HF and mlx-community layouts, shards, affine quantization), the layers
// (Linear, Embedding, RMSNorm, RoPE, attention, SwiGLU), the KV cache, and the forward
// pass with hidden-state taps that the DFlash drafter reads.
//
// Families register themselves by config.json `model_type` (see Register); Load picks the
// family, validates every tensor's name, shape and dtype before building anything, and
// returns a Model. The math follows mlx-lm op for op so that CPU results are bit-identical
// to the reference.
//
// On CUDA the per-node host cost of MLX's backend dominates decoding, so the package also
// holds what shapes the graph for it: 2-D activations (no Flatten/Unflatten around
// matmuls), padded attention keys for multi-token blocks (KeyBucketDefault, one cuDNN plan
// per 256 positions), and opt-in pieces measured or still to be measured on the H200: the
// few-row product kernel (SkinnyGEMM), merged projections (MergeLinears) and the GPU-exact
// mode (GPUExactDefault). All keep CPU results bit-identical (tested).
//
// All methods that touch arrays must run on the MLX thread (mlxc.Do).
package model

// Package model holds the contracts of the target language models (Model, its forward with
// the hidden-state taps that the DFlash drafter reads, the family registry, Load), config
// parsing, safetensors loading with validation (HF and mlx-community layouts, shards,
// affine quantization), the layers that families share (Linear, Embedding, RMSNorm, RoPE,
// attention routing, SwiGLU) and the KV cache layer.
//
// Families live in their own packages (model/qwen3, ...) and register themselves by
// config.json `model_type` (see Register); model/families imports them all. Load picks the
// family, validates every tensor's name, shape and dtype before building anything, and
// returns a Model. The math follows mlx-lm op for op so that CPU results are bit-identical
// to the reference.
//
// On CUDA the package also holds what shapes the graph and the device work for MLX's
// backend: 2-D activations (no Flatten/Unflatten around matmuls), our own kernels for
// few-row products (SkinnyGEMM: tensor cores, K split over blocks for narrow weights, the
// residual add and the MLP activation done as the product is written),
// multi-token attention (FewQueryAttention) and fused layer steps (Fused: head prep that
// also writes a device-placed block into the KV cache, gated activation), small inputs
// kept in device memory (OnDevice: MLX keeps small arrays in unified memory), and the
// GPU-exact mode (GPUExactDefault). On the CPU backend none of these is used, and results
// stay bit-identical to mlx-lm (tested).
//
// All methods that touch arrays must run on the MLX thread (mlxc.Do).
package model

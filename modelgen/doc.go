// Package modelgen writes small models with random weights in the exact on-disk formats of
// real checkpoints (Hugging Face layout: config.json + safetensors, optionally sharded with
// an index; mlx-community layout: affine-quantized with "quantization" in config.json), and
// DFlash drafters in z-lab's layout. Tests, `make demo` and the benchmarks use it, since no
// real checkpoint can be downloaded here. Weights are seeded and reproducible.
package modelgen

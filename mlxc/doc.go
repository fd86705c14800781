// Package mlxc is the only cgo package of dflash-mlx: Go bindings over our own small C API
// (csrc/mlxc.h) around MLX's C++ API.
//
// What it gives the rest of the engine:
//   - Array: a handle to a lazy MLX array, with constructors from Go slices and raw bytes
//     (bf16/f16 bit patterns arrive unchanged) and contiguous read-back.
//   - The ops the models need (arithmetic, shapes, slicing with dynamic offsets, indexing,
//     reductions, sorting, random), the fused `fast` ops (rms_norm, rope, sdpa), affine
//     quantization, custom CUDA/Metal kernels, compile, safetensors I/O and memory stats.
//   - The MLX thread: MLX keeps streams, compile caches and PRNG state per OS thread, so all
//     MLX work runs on one goroutine locked to its OS thread. Do(fn) runs fn there.
//   - Scopes: every array created while a Scope is open belongs to it and is freed when the
//     scope closes, unless it is kept. Arrays are never left to finalizers.
//
// Errors: a failing op panics with *Error (a C++ exception turned into a value, never a
// crash); Do and Catch recover it and return it as an error. Model code therefore reads
// like math, and package boundaries turn failures into ordinary errors.
package mlxc

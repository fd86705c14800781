// Package kernels owns the engine's custom GPU kernels: their sources, kept in real files
// under cuda/ and metal/ and embedded at build time, and one registry (All) that the
// offline NVRTC compile check and `dflash-mlx version --json` list. Each kernel is a
// Kernel value: the name MLX builds it under and its source per backend (CUDA, and for
// some a Metal twin under metal/ with the same contract). The model package launches them
// through its layer operations (SkinnyGEMM, FewQueryAttention, Fused, RowArgmax), which
// fall back to plain MLX ops where a kernel cannot run.
//
// The files are fragments of a kernel body as MLX's custom-kernel API takes it (the
// generated function's signature comes from the inputs and outputs); a body made of
// several files is their concatenation, byte for byte, so that what NVRTC compiles is
// pinned by model's source hashes (model/testdata/cuda_kernel_sources.sha256).
package kernels

// Backend is a GPU backend a kernel has a source for.
type Backend string

// CUDA is MLX's CUDA backend (fast::cuda_kernel, compiled by NVRTC at first use).
const CUDA Backend = "cuda"

// Metal is MLX's Metal backend (fast::metal_kernel).
const Metal Backend = "metal"

// FallbackBackend names what runs where no kernel does: the layer operation's plain MLX
// ops, with the same contract.
const FallbackBackend = "fallback (mlx ops)"

// Source is a kernel's text for one backend: Header goes before the generated function
// (device helpers, macros), Body is the function's body.
type Source struct {
	Header, Body string
}

// Kernel is one custom kernel.
type Kernel struct {
	// Name is the name MLX builds and caches the kernel under (unique).
	Name string
	// CUDA is the source for the CUDA backend.
	CUDA Source
	// Metal is the source for the Metal backend; an empty Body means the kernel has none.
	Metal Source
	// Contract is what every backend's source takes and makes, for kernels with twins: the
	// launch passes the same arrays and template arguments to each.
	Contract Contract
}

// Contract is a kernel's interface: its input and output arrays, in launch order, and its
// template arguments.
type Contract struct {
	Inputs, Outputs, Template []string
}

// Backends lists the backends k has a source for, CUDA first.
func (k Kernel) Backends() []Backend {
	var out []Backend
	if k.CUDA.Body != "" {
		out = append(out, CUDA)
	}
	if k.Metal.Body != "" {
		out = append(out, Metal)
	}
	return out
}

// All lists every custom kernel, in a fixed order.
func All() []Kernel {
	return []Kernel{SkinnyGEMMTC, SkinnyGEMMTCSplit, SkinnyGEMMTCSplitNorm, FewQueryAttention,
		HeadPrep, HeadPrepInto, KVPrepInto, PrepAttention, GatedAct, PadPosition, RowArgmax, RowLead,
		GatedDeltaTape, GatedDeltaReplay, SplitKeys, SplitKeysMMA, SplitKeysMerge, QuantMatmulSmallM}
}

// Entry is one kernel as `dflash-mlx version --json` lists it.
type Entry struct {
	Name    string `json:"name"`
	Backend string `json:"backend"`
}

// Listing is ListingFor without Metal: the backends where custom CUDA kernels can run
// (cudaHere) or none can.
func Listing(cudaHere bool) []Entry { return ListingFor(cudaHere, false) }

// ListingFor is All with the backend each kernel runs on here: "cuda" where custom CUDA
// kernels can run (cudaHere: MLX's CUDA backend on a GPU) and the kernel has a CUDA
// source, "metal" where Metal kernels can (metalHere: MLX's Metal backend on a GPU) and
// it has a Metal source, FallbackBackend otherwise. Settings may still turn a kernel off
// (DFLASH_*).
func ListingFor(cudaHere, metalHere bool) []Entry {
	var out []Entry
	for _, k := range All() {
		b := FallbackBackend
		switch {
		case cudaHere && k.CUDA.Body != "":
			b = string(CUDA)
		case metalHere && k.Metal.Body != "":
			b = string(Metal)
		}
		out = append(out, Entry{Name: k.Name, Backend: b})
	}
	return out
}

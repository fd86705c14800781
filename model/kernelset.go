package model

// Kernels are the custom kernels a target owns that a drafter bound to it reuses: shared,
// not owned, so the drafter never frees them. A nil field is a kernel that is off (or not
// on CUDA).
type Kernels struct {
	Skinny *SkinnyGEMM        // the few-row product kernel
	FQA    *FewQueryAttention // the few-query attention kernel
	QMM    *SmallMQuantMatmul // the small-M quantized product kernel
}

// KernelProvider is a model whose kernels a drafter may reuse; a family without custom
// kernels need not implement it.
type KernelProvider interface {
	Kernels() Kernels
}

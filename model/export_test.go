package model

// MergeProjections lets the external tests merge projections without the fused kernels, to
// check merged products against separate ones where those kernels do not run.
var MergeProjections = &mergeProjections

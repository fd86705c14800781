package model

import "fmt"

// MergeProjections lets the external tests merge projections without the fused kernels, to
// check merged products against separate ones where those kernels do not run.
var MergeProjections = &mergeProjections

// SkinnyTiled reports whether s sends weights through its tensor-core tiled copies.
func SkinnyTiled(s *SkinnyGEMM) bool { return s.tiled }

// UseTCRule makes s launch the tensor-core kernel by rule (a DFLASH_TC_RULE value; "": the
// default rule) in the tiled layout or not, for the in-model sweep.
func UseTCRule(s *SkinnyGEMM, rule string, tiled bool) error {
	cfg := tcConfigFor
	if rule != "" {
		r, err := parseTCRule(rule)
		if err != nil {
			return fmt.Errorf("rule %q: %w", rule, err)
		}
		cfg = r
	}
	s.configFor, s.tiled = cfg, tiled
	return nil
}

// OnCUDA runs f on the MLX thread on a CUDA GPU, and skips elsewhere.
var OnCUDA = onCUDA

package model

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Launch shapes of the tensor-core few-row kernel are chosen end to end, inside the model
// (a shape that is faster alone can be slower between the layer's other kernels: see
// docs/perf/tensor-core-products.md). DFLASH_TC_RULE lets one GPU run compare shapes per
// class of product side by side:
//
//	""       tcConfigFor
//	"wide=4/8/4p,down=4/4/4,narrow=1/4/2p"
//	         tcConfigFor with the named classes replaced; a shape is TILES/WARPS/UNROLL,
//	         "p" appended for the software-pipelined loop, then "xN" to split K over N
//	         blocks per column tile or "xa" for resolve's automatic split; or
//	         TILES/WARPS/sSTAGESkKT for the shared-memory pipeline (TestSkinnyTCSweep's
//	         names)
//
// Classes: wide (N ≥ 16384: merged gate/up, the vocabulary head), down (K ≥ 8192), mid
// (N ≥ 4096: merged q/k/v, the drafter's q), narrow (the rest: o, the drafter's k and v). A
// product that a replacement does not fit keeps tcConfigFor's shape.

// tcClasses are the classes tcClass names, in the order its rules are tried.
var tcClasses = []string{"wide", "down", "mid", "narrow"}

// tcClass names the class of an [N, K] product for DFLASH_TC_RULE.
func tcClass(N, K int) string {
	switch {
	case N >= 16384:
		return "wide"
	case K >= 8192:
		return "down"
	case N >= 4096:
		return "mid"
	}
	return "narrow"
}

// parseTCRule turns a DFLASH_TC_RULE value into a launch rule.
func parseTCRule(v string) (func(N, K int) tcConfig, error) {
	switch v {
	case "":
		return tcConfigFor, nil
	}
	over := map[string]tcConfig{}
	for _, part := range strings.Split(v, ",") {
		class, shape, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want CLASS=SHAPE, e.g. wide=4/8/4p", part)
		}
		if !slices.Contains(tcClasses, class) {
			return nil, fmt.Errorf("%q: unknown class %q (%s)", part, class, strings.Join(tcClasses, ", "))
		}
		if _, dup := over[class]; dup {
			return nil, fmt.Errorf("class %q given twice", class)
		}
		c, err := parseTCConfig(shape)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		over[class] = c
	}
	return func(N, K int) tcConfig {
		if c, ok := over[tcClass(N, K)]; ok {
			if c = c.resolve(N, K); c.fits(N, K) {
				return c
			}
		}
		return tcConfigFor(N, K)
	}, nil
}

// parseTCConfig reads TILES/WARPS/UNROLL[p][xSPLIT|xa] or TILES/WARPS/sSTAGESkKT.
func parseTCConfig(s string) (tcConfig, error) {
	f := strings.Split(s, "/")
	if len(f) != 3 {
		return tcConfig{}, fmt.Errorf("shape %q: want TILES/WARPS/UNROLL[p] or TILES/WARPS/sSTAGESkKT", s)
	}
	var c tcConfig
	var err error
	if c.Tiles, err = strconv.Atoi(f[0]); err != nil || (c.Tiles != 1 && c.Tiles != 2 && c.Tiles != 4) {
		return tcConfig{}, fmt.Errorf("shape %q: tiles must be 1, 2 or 4", s)
	}
	if c.Warps, err = strconv.Atoi(f[1]); err != nil || (c.Warps != 4 && c.Warps != 8 && c.Warps != 16) {
		return tcConfig{}, fmt.Errorf("shape %q: warps must be 4, 8 or 16", s)
	}
	last := f[2]
	if st, kt, staged := strings.Cut(strings.TrimPrefix(last, "s"), "k"); staged && strings.HasPrefix(last, "s") {
		c.Stages, err = strconv.Atoi(st)
		if err == nil {
			c.KT, err = strconv.Atoi(kt)
		}
		if err != nil || c.Stages < 2 || c.Stages > 4 || c.KT < 32 || c.KT%32 != 0 {
			return tcConfig{}, fmt.Errorf("shape %q: staged shapes are sSTAGESkKT, 2 ≤ STAGES ≤ 4, KT a multiple of 32", s)
		}
		return c, nil
	}
	if body, split, ok := strings.Cut(last, "x"); ok {
		last = body
		if split == "a" {
			c.Split = tcSplitAuto
		} else if c.Split, err = strconv.Atoi(split); err != nil || c.Split < 1 || c.Split > 64 {
			return tcConfig{}, fmt.Errorf("shape %q: split must be 1..64 or a (automatic)", s)
		}
	}
	c.Pipe = strings.HasSuffix(last, "p")
	if c.Unroll, err = strconv.Atoi(strings.TrimSuffix(last, "p")); err != nil || c.Unroll < 1 || c.Unroll > 8 {
		return tcConfig{}, fmt.Errorf("shape %q: unroll must be 1..8", s)
	}
	return c, nil
}

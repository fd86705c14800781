package model

import (
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// A template is built once per key and handed back as is afterwards; other keys get their own.
func TestTemplateCache(t *testing.T) {
	var c templateCache[tcTemplateKey]
	builds := 0
	get := func(k tcTemplateKey) []mlxc.TemplateArg {
		return c.get(k, func() []mlxc.TemplateArg { builds++; return k.c.template(k.dt) })
	}
	a := tcTemplateKey{tcConfigFor(2560, 4096), mlxc.BFloat16}
	b := tcTemplateKey{tcConfigFor(2560, 4096), mlxc.Float16}
	first := get(a)
	if again := get(a); &again[0] != &first[0] || builds != 1 {
		t.Errorf("same key: built %d times, same slice %v", builds, &again[0] == &first[0])
	}
	other := get(b)
	if builds != 2 || other[0].Value != mlxc.Float16 || first[0].Value != mlxc.BFloat16 {
		t.Errorf("another key: %d builds, types %v and %v", builds, first[0].Value, other[0].Value)
	}
}

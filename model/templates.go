package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// templateCache memoizes a kernel's template arguments by what determines them: built per
// call, their boxed values were a measurable part of building a cycle's graph (hundreds of
// launches a cycle). MLX thread only, like the kernels it serves.
type templateCache[K comparable] map[K][]mlxc.TemplateArg

// get returns the arguments for key, made by build the first time.
func (c *templateCache[K]) get(key K, build func() []mlxc.TemplateArg) []mlxc.TemplateArg {
	if t, ok := (*c)[key]; ok {
		return t
	}
	if *c == nil {
		*c = templateCache[K]{}
	}
	t := build()
	(*c)[key] = t
	return t
}

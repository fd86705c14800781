package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import "sort"

// LoadSafetensors maps a safetensors file's tensors lazily (each reads its bytes when
// evaluated; keep the file in place until then) and returns its __metadata__.
// The returned arrays belong to the current scope, like any new array.
func LoadSafetensors(path string) (map[string]*Array, map[string]string) {
	p, free := cstr(path)
	defer free()
	var m C.mlxc_tensor_map
	check("load_safetensors "+path, C.mlxc_load_safetensors(&m, p, curStream.c))
	defer C.mlxc_tensor_map_free(m)
	n := int(C.mlxc_tensor_map_count(m))
	tensors := make(map[string]*Array, n)
	for i := 0; i < n; i++ {
		var name *C.char
		var h C.mlxc_array
		check("load_safetensors", C.mlxc_tensor_map_at(m, C.int(i), &name, &h))
		tensors[C.GoString(name)] = newArray(h)
	}
	meta := map[string]string{}
	for i := 0; i < int(C.mlxc_tensor_map_meta_count(m)); i++ {
		var k, v *C.char
		check("load_safetensors", C.mlxc_tensor_map_meta_at(m, C.int(i), &k, &v))
		meta[C.GoString(k)] = C.GoString(v)
	}
	return tensors, meta
}

// SaveSafetensors writes the tensors (evaluated and made contiguous) with metadata.
// MLX appends ".safetensors" when path lacks it.
func SaveSafetensors(path string, tensors map[string]*Array, meta map[string]string) {
	var m C.mlxc_tensor_map
	check("save_safetensors", C.mlxc_tensor_map_new(&m))
	defer C.mlxc_tensor_map_free(m)
	names := make([]string, 0, len(tensors))
	for k := range tensors {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ck, free := cstr(k)
		rc := C.mlxc_tensor_map_put(m, ck, tensors[k].handle("save_safetensors"))
		free()
		check("save_safetensors", rc)
	}
	for k, v := range meta {
		ck, f1 := cstr(k)
		cv, f2 := cstr(v)
		rc := C.mlxc_tensor_map_put_meta(m, ck, cv)
		f1()
		f2()
		check("save_safetensors", rc)
	}
	p, free := cstr(path)
	defer free()
	check("save_safetensors "+path, C.mlxc_save_safetensors(p, m))
}

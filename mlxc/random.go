package mlxc

/*
#include "mlxc.h"
*/
import "C"

// RandomKey makes a PRNG key (uint32 [2]) from a seed. Keys are explicit everywhere: MLX's
// implicit key sequence is per thread and would make results depend on scheduling.
func RandomKey(seed uint64) *Array {
	var h C.mlxc_array
	check("random.key", C.mlxc_random_key(&h, C.uint64_t(seed)))
	return newArray(h)
}

// RandomSplit splits a key into num keys ([num, 2]).
func RandomSplit(key *Array, num int) *Array {
	var h C.mlxc_array
	check("random.split", C.mlxc_random_split(&h, key.handle("random.split"), C.int(num), curStream.c))
	return newArray(h)
}

// Categorical samples indices (uint32) from unnormalised log-probabilities along axis.
func Categorical(logits *Array, axis int, key *Array) *Array {
	var h C.mlxc_array
	check("random.categorical", C.mlxc_random_categorical(&h, logits.handle("random.categorical"), C.int(axis), optHandle("random.categorical", key), curStream.c))
	return newArray(h)
}

// Uniform samples in [low, high).
func Uniform(low, high float64, shape []int, dt Dtype, key *Array) *Array {
	var h C.mlxc_array
	func() {
		s := NewScope() // the bounds; closed also when the op fails
		defer s.Close()
		lo, hi := Scalar(low, dt), Scalar(high, dt)
		var buf [8]C.int
		check("random.uniform", C.mlxc_random_uniform(&h, lo.h, hi.h, cInts(shape, &buf), C.int(len(shape)), C.int(dt), optHandle("random.uniform", key), curStream.c))
	}()
	return newArray(h)
}

// Normal samples from N(loc, scale²).
func Normal(shape []int, dt Dtype, loc, scale float32, key *Array) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("random.normal", C.mlxc_random_normal(&h, cInts(shape, &buf), C.int(len(shape)), C.int(dt), C.float(loc), C.float(scale), optHandle("random.normal", key), curStream.c))
	return newArray(h)
}

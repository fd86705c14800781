package model

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func header(json string) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(json)))
	b.WriteString(json)
	return b.Bytes()
}

// FuzzSafetensorsHeader: any byte string either parses into ranges that lie inside the
// file and match their shapes, or gives an error; never a panic.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(append(header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), make([]byte, 8)...))
	f.Add(append(header(`{"__metadata__":{"format":"mlx"},"w":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}}`), make([]byte, 4)...))
	f.Add(header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := parseSafetensorsHeader("fuzz", bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		n := binary.LittleEndian.Uint64(data[:8])
		dataSize := int64(len(data)) - 8 - int64(n)
		for name, ti := range h.Tensors {
			if ti.Begin < 0 || ti.End > dataSize || ti.End < ti.Begin {
				t.Fatalf("%s: range [%d,%d) outside %d", name, ti.Begin, ti.End, dataSize)
			}
			count := int64(1)
			for _, d := range ti.Shape {
				count *= int64(d)
			}
			if count*int64(ti.Dtype.Size()) != ti.End-ti.Begin {
				t.Fatalf("%s: size mismatch", name)
			}
		}
	})
}

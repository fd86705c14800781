package mlxc

import (
	enc "encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type stEntry struct {
	Dtype   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// readSafetensorsHeader parses the file format directly (8-byte little-endian header
// length, JSON header, data), independently of MLX.
func readSafetensorsHeader(t *testing.T, path string) (map[string]stEntry, map[string]string, []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < 8 {
		t.Fatalf("%s: %d bytes", path, len(raw))
	}
	n := int(enc.LittleEndian.Uint64(raw))
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		t.Fatalf("%s: header: %v", path, err)
	}
	entries := map[string]stEntry{}
	meta := map[string]string{}
	for k, v := range hdr {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &meta); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var e stEntry
		if err := json.Unmarshal(v, &e); err != nil {
			t.Fatal(err)
		}
		entries[k] = e
	}
	return entries, meta, raw[8+n:]
}

func TestSafetensorsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	g := lcg(77)
	bf := make([]uint16, 6*5)
	for i := range bf {
		bf[i] = uint16(g.u32()) // any pattern, NaNs included: files carry bits
	}
	f := g.floats(4*3, -10, 10)
	ints := []int32{-2147483648, -1, 0, 1, 2147483647, 12345}
	u := []uint32{0, 1, 0xDEADBEEF, 0xFFFFFFFF}
	meta := map[string]string{"format": "mlx", "note": "ünïcode, \"quotes\" and spaces", "empty": ""}
	want := map[string]struct {
		dt    Dtype
		st    string
		shape []int
	}{
		"model.embed.weight": {BFloat16, "BF16", []int{6, 5}},
		"f32":                {Float32, "F32", []int{4, 3}},
		"layers.0.i32":       {Int32, "I32", []int{2, 3}},
		"u32":                {Uint32, "U32", []int{4}},
	}
	var wantBytes map[string][]byte
	onMLX(t, func() {
		tensors := map[string]*Array{
			"model.embed.weight": FromBF16Bits(bf, 6, 5),
			"f32":                Transpose(f32(f, 3, 4)), // a non-contiguous view is saved in logical order
			"layers.0.i32":       FromSlice(ints, 2, 3),
			"u32":                FromSlice(u, 4),
		}
		wantBytes = map[string][]byte{}
		for k, a := range tensors {
			wantBytes[k] = a.Bytes()
		}
		SaveSafetensors(path, tensors, meta)

		got, gotMeta := LoadSafetensors(path)
		if len(got) != len(tensors) {
			t.Errorf("loaded %d tensors, want %d", len(got), len(tensors))
		}
		for k, w := range want {
			a := got[k]
			if a == nil {
				t.Errorf("tensor %q missing", k)
				continue
			}
			if a.Dtype() != w.dt {
				t.Errorf("%s: dtype %v, want %v", k, a.Dtype(), w.dt)
			}
			eqShape(t, k, a.Shape(), w.shape)
			eqSlice(t, k+" bytes", a.Bytes(), wantBytes[k])
		}
		if len(gotMeta) != len(meta) {
			t.Errorf("metadata %v, want %v", gotMeta, meta)
		}
		for k, v := range meta {
			if gotMeta[k] != v {
				t.Errorf("metadata %q = %q, want %q", k, gotMeta[k], v)
			}
		}
	})
	if t.Failed() {
		return
	}
	// The file itself is standard safetensors.
	entries, fileMeta, data := readSafetensorsHeader(t, path)
	for k, w := range want {
		e, ok := entries[k]
		if !ok {
			t.Errorf("file lacks %q", k)
			continue
		}
		if e.Dtype != w.st {
			t.Errorf("file: %s dtype %q, want %q", k, e.Dtype, w.st)
		}
		eqShape(t, "file "+k, e.Shape, w.shape)
		eqSlice(t, "file bytes of "+k, data[e.Offsets[0]:e.Offsets[1]], wantBytes[k])
	}
	for k, v := range meta {
		if fileMeta[k] != v {
			t.Errorf("file metadata %q = %q, want %q", k, fileMeta[k], v)
		}
	}
}

// Bad files give errors, never crashes. MLX reads tensor data lazily, so a file whose data is
// cut short loads, and the error comes when the tensor is evaluated.
func TestSafetensorsBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.safetensors")
	onMLX(t, func() {
		SaveSafetensors(good, map[string]*Array{"w": f32(seq(256), 16, 16), "b": f32(seq(4), 4)}, map[string]string{"k": "v"})
	})
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	hdrLen := int(enc.LittleEndian.Uint64(raw))
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hugeHeader := append([]byte(nil), raw...)
	enc.LittleEndian.PutUint64(hugeHeader, 1<<40)
	badJSON := append([]byte(nil), raw...)
	copy(badJSON[8:], "{\"w\": [[[")
	files := []struct {
		name, path string
	}{
		{"missing file", filepath.Join(dir, "nope.safetensors")},
		{"empty file", write("empty.safetensors", nil)},
		{"garbage", write("garbage.safetensors", []byte("this is not a safetensors file at all, just text......"))},
		{"header length past the end", write("huge.safetensors", hugeHeader)},
		{"header cut short", write("cut_header.safetensors", raw[:8+hdrLen/2])},
		{"broken JSON", write("json.safetensors", badJSON)},
		{"data cut short", write("cut_data.safetensors", raw[:len(raw)-100])},
		{"no data at all", write("no_data.safetensors", raw[:8+hdrLen])},
	}
	for _, f := range files {
		err := Do(func() error {
			s := NewScope()
			defer s.Close()
			tensors, _ := LoadSafetensors(f.path)
			arrs := make([]*Array, 0, len(tensors))
			for _, a := range tensors {
				arrs = append(arrs, a)
			}
			Eval(arrs...)
			for _, a := range arrs {
				a.Bytes()
			}
			return nil
		})
		if err == nil {
			t.Errorf("%s: loaded and evaluated without an error", f.name)
		} else if !strings.Contains(err.Error(), f.path) {
			t.Errorf("%s: error %q does not name the file", f.name, err)
		}
	}

	// The file shrinks after the lazy load: the error comes from Eval (raised on MLX's CPU
	// worker and rethrown), not a crash.
	victim := write("victim.safetensors", raw)
	err = Do(func() error {
		s := NewScope()
		defer s.Close()
		tensors, _ := LoadSafetensors(victim)
		if err := os.Truncate(victim, int64(8+hdrLen+10)); err != nil {
			t.Error(err)
		}
		Eval(tensors["w"], tensors["b"])
		tensors["w"].Float32s()
		return nil
	})
	if err == nil {
		t.Errorf("file truncated after loading: evaluated without an error")
	} else {
		t.Logf("file truncated after loading: %v", err)
	}
	// The runtime keeps working, and the good file still loads.
	onMLX(t, func() {
		tensors, meta := LoadSafetensors(good)
		closeTo(t, "good file after bad ones", tensors["b"].Float32s(), seq(4), 0)
		if meta["k"] != "v" {
			t.Errorf("metadata %v", meta)
		}
	})
}

package model

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// TensorInfo is one entry of a safetensors header.
type TensorInfo struct {
	Name  string
	Dtype mlxc.Dtype
	Shape []int
	Begin int64 // byte offsets into the data section
	End   int64
}

// SafetensorsHeader is the parsed and validated header of one file.
type SafetensorsHeader struct {
	Path     string
	Tensors  map[string]TensorInfo
	Metadata map[string]string
}

// maxHeaderBytes bounds the JSON header we are willing to parse (real ones are < 10 MB).
const maxHeaderBytes = 100 << 20

// ReadSafetensorsHeader parses a safetensors file's header and checks it against the file:
// known dtypes, non-negative shapes, byte ranges that match shape×dtype, lie inside the file
// and do not overlap. MLX reads tensors lazily and would fail late (or read garbage) on a
// truncated file; this check makes such files a clear error before anything is built.
func ReadSafetensorsHeader(path string) (*SafetensorsHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return parseSafetensorsHeader(path, f, st.Size())
}

func parseSafetensorsHeader(path string, r io.Reader, fileSize int64) (*SafetensorsHeader, error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("%s: not a safetensors file (no 8-byte header length): %w", path, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n == 0 || n > maxHeaderBytes || int64(n) > fileSize-8 {
		return nil, fmt.Errorf("%s: header length %d does not fit a %d-byte file (truncated or not safetensors)", path, n, fileSize)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("%s: truncated header: %w", path, err)
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("%s: header is not valid JSON: %w", path, err)
	}
	h := &SafetensorsHeader{Path: path, Tensors: map[string]TensorInfo{}, Metadata: map[string]string{}}
	dataSize := fileSize - 8 - int64(n)
	for name, msg := range entries {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%s: __metadata__ must map strings to strings: %w", path, err)
			}
			continue
		}
		var e struct {
			Dtype   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %q: bad header entry: %w", path, name, err)
		}
		dt, err := mlxc.ParseDtype(e.Dtype)
		if err != nil || dt == mlxc.Complex64 && e.Dtype != "C64" {
			return nil, fmt.Errorf("%s: tensor %q: unsupported dtype %q", path, name, e.Dtype)
		}
		if len(e.Offsets) != 2 {
			return nil, fmt.Errorf("%s: tensor %q: data_offsets must have 2 entries", path, name)
		}
		count := int64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || d > 1<<31 {
				return nil, fmt.Errorf("%s: tensor %q: bad dimension %d", path, name, d)
			}
			shape[i] = int(d)
			count *= d
			if count > 1<<40 {
				return nil, fmt.Errorf("%s: tensor %q: shape %v is too large", path, name, e.Shape)
			}
		}
		begin, end := e.Offsets[0], e.Offsets[1]
		if begin < 0 || end < begin || end > dataSize {
			return nil, fmt.Errorf("%s: tensor %q: bytes [%d, %d) outside the %d-byte data section (file truncated?)", path, name, begin, end, dataSize)
		}
		if end-begin != count*int64(dt.Size()) {
			return nil, fmt.Errorf("%s: tensor %q: %d bytes stored, shape %v of %s needs %d", path, name, end-begin, e.Shape, dt, count*int64(dt.Size()))
		}
		h.Tensors[name] = TensorInfo{Name: name, Dtype: dt, Shape: shape, Begin: begin, End: end}
	}
	// Overlapping ranges mean a corrupt header.
	infos := make([]TensorInfo, 0, len(h.Tensors))
	for _, t := range h.Tensors {
		infos = append(infos, t)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Begin < infos[j].Begin })
	for i := 1; i < len(infos); i++ {
		if infos[i].Begin < infos[i-1].End {
			return nil, fmt.Errorf("%s: tensors %q and %q overlap", path, infos[i-1].Name, infos[i].Name)
		}
	}
	return h, nil
}

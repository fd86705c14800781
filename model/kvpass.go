package model

import (
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// KVPass is how one forward of a target family reaches its KV layers: the attention path,
// chosen once for the whole block, and the arrays that all its attention layers share
// because they hold the same positions. Every family with KV layers routes through it, so
// that the rules (placed blocks, row-by-row verify, padded keys, the few-query kernel)
// live in one place.
type KVPass struct {
	Opt  ForwardOptions
	B, L int
	// At: the block sits at a device position (Opt.Pos); Rowwise: one-query attention per
	// row (Opt.RowwiseAttention); FQA: the few-query kernel may run (exact key lengths, no
	// plan to rebuild); PadKeys: keys padded to Opt.KeyBucket under a mask.
	At, Rowwise, FQA, PadKeys bool
	Mask                      string // the plain SDPA path's mask mode
	Off0                      int    // the KV layers' offset at row 0
	fqa                       *FewQueryAttention
	onDevice                  func(*mlxc.Array) *mlxc.Array
	padMask, pos, kpos        *mlxc.Array // made by the first layer that needs them
}

// NewKVPass picks the path of a block of B×L rows at the KV layers' offset off0. op names
// the family's forward in errors; fqa is its few-query kernel (nil: off); onDevice puts a
// position where the family's kernels read it (nil: OnDevice).
func NewKVPass(op string, B, L int, opt ForwardOptions, fqa *FewQueryAttention, off0 int, onDevice func(*mlxc.Array) *mlxc.Array) *KVPass {
	p := &KVPass{Opt: opt, B: B, L: L, Mask: mlxc.MaskNone, Off0: off0, fqa: fqa, onDevice: onDevice, pos: opt.Pos}
	if p.onDevice == nil {
		p.onDevice = OnDevice
	}
	if L > 1 {
		p.Mask = mlxc.MaskCausal // bottom-right aligned: right for prefill chunks and verify blocks
	}
	p.At = opt.Pos != nil
	if p.At && (B != 1 || opt.Window < L) {
		panic(&mlxc.Error{Op: op, Msg: fmt.Sprintf("a block at a device position needs B = 1 and a window ≥ %d rows, got B = %d, window %d", L, B, opt.Window)})
	}
	p.Rowwise = L > 1 && L <= MaxBucketedQueries && opt.RowwiseAttention && !fqa.RowConsistent() && !p.At
	p.FQA = B == 1 && fqa != nil && !p.Rowwise
	p.PadKeys = L > 1 && L <= MaxBucketedQueries && opt.KeyBucket > 0 && !p.Rowwise && !p.FQA && !p.At
	return p
}

// MaxKeys bounds the keys the block's queries see: the window of a placed block (its
// position is on the device), else the offset after the block.
func (p *KVPass) MaxKeys() int {
	if p.At {
		return p.Opt.Window
	}
	return p.Off0 + p.L
}

// SplitKeys reports whether the block's attention takes the split-key kernels (then not
// the kernel that also preps the heads, whose attention is the few-query one).
func (p *KVPass) SplitKeys() bool { return p.FQA && p.fqa.Splits(p.MaxKeys()) }

// Position is row 0's position as a device array: the caller's, or one made when first
// needed and shared by all layers.
func (p *KVPass) Position() *mlxc.Array {
	if p.pos == nil {
		p.pos = Visible(p.Off0)
	}
	return p.pos
}

// KernelPos is Position for the custom kernels, in device memory.
func (p *KVPass) KernelPos() *mlxc.Array {
	if p.kpos == nil {
		p.kpos = p.onDevice(p.Position())
	}
	return p.kpos
}

// RotateAt reports whether RoPE takes the device position (RoPE.ApplyAt) rather than the
// host offset: for placed blocks, and in GPU-exact mode, which rotates decode steps and
// verify blocks with the same kernel (MLX's static- and dynamic-offset RoPE may round
// differently).
func (p *KVPass) RotateAt() bool { return p.At || p.fqa.RowConsistent() }

// Keys writes the block's heads k, v [B, n, L, D] into the layer's cache the way the
// block's path reads them and says where Attention.Attend finds them. keys and values are
// the cache's buffers when head prep already wrote the block into them (a placed block;
// k and v are then unused), else nil.
func (p *KVPass) Keys(lc *KVCache, q, k, v, keys, values *mlxc.Array) AttendKeys {
	var ak AttendKeys
	switch {
	case p.At:
		if keys == nil {
			keys, values = lc.WriteAt(k, v, p.pos, p.Opt.Window)
		}
		ak.Fits, ak.MaxKeys = keys, p.MaxKeys()
		ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) { return keys, values, p.KernelPos() }
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			if p.padMask == nil {
				p.padMask = WindowMask(p.pos, p.L, p.Opt.Window, true)
			}
			w := p.Opt.Window
			return mlxc.SliceAxis(keys, 2, 0, w), mlxc.SliceAxis(values, 2, 0, w), mlxc.MaskArray, p.padMask
		}
	case p.Rowwise:
		ak.Rowwise, ak.Off0 = true, p.Off0
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values := lc.UpdateAndFetch(k, v)
			return keys, values, p.Mask, nil
		}
	case p.PadKeys:
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values, K := lc.UpdateAndFetchPadded(k, v, p.Opt.KeyBucket)
			if p.padMask == nil {
				off0 := p.Off0
				p.padMask = PrefixMask(p.L, K, func(i int) int { return off0 + i + 1 }, q.Dtype())
			}
			return keys, values, mlxc.MaskArray, p.padMask
		}
	default: // the kernel's blocks come here: FQA rules out rowwise and padded keys
		ak.Fits, ak.MaxKeys = k, p.MaxKeys()
		ak.Kernel = func() (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
			keys, values := lc.AppendBuffers(k, v) // the kernel reads only the visible rows
			return keys, values, p.KernelPos()
		}
		ak.Dense = func() (*mlxc.Array, *mlxc.Array, string, *mlxc.Array) {
			keys, values := lc.UpdateAndFetch(k, v)
			return keys, values, p.Mask, nil
		}
	}
	if !p.FQA {
		ak.Kernel = nil
	}
	return ak
}

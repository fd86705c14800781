package model

import (
	"os"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// PrepAttention (DFLASH_FUSE_PREP_ATTN=1; off by default until a GPU run has checked it:
// TestPrepAttentionMatchesSeparate) is HeadPrepInto and the few-query attention kernel in
// one kernel for a block whose keys and values go into the KV cache in place: one node per
// layer instead of two (41 of a DFlash cycle's 331 on the 4B shape), each node being host
// time on every cycle. Each block of the grid (one per q head and row, as the attention
// kernel's) prepares its own q row and the new key and value rows it sees (q/k norm and
// rotation as headPrepSource computes them, rounded to T where that kernel stores) into
// shared memory, reads the keys before the block from the cache and the block's own from
// shared memory, and attends in the attention kernel's order: the same values bit for bit.
// One block per kv head and row (the group's first q head) also stores that row's key and
// value into the cache for later steps; no block reads a row another writes.
const prepAttnSource = `
  constexpr int DPL = D / 32; // output dimensions per lane
  constexpr int P = D / 64;   // rotation pairs per lane
  struct alignas(DPL * sizeof(T)) VecT {
    T e[DPL];
  };
  const float NEG_INF = __int_as_float((int)0xff800000u);
  __shared__ __align__(16) T qt[D];
  __shared__ __align__(16) T kr_s[LMAX][D];
  __shared__ __align__(16) T vr_s[LMAX][D];
  __shared__ float qs[D];
  __shared__ float wm[WARPS];
  __shared__ float wl[WARPS];
  __shared__ float wo[WARPS][D];
  const int L = y_shape[0];
  const size_t ystride = y_shape[1];
  const int h = blockIdx.x % HQ;
  const int l = blockIdx.x / HQ;
  if (l >= L) return; // block-uniform
  const int hk = h / (HQ / HK);
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int pos = off[0];                 // the block's first row
  const int rows = CAUSAL ? l + 1 : L;    // the block's rows this query sees
  const int n = pos + rows;               // keys it sees
  const int R = ck_shape[2];
  const bool writer = h % (HQ / HK) == 0; // stores its row's key and value
  // One row of one head, as headPrepSource: per-head RMSNorm with nw and the rotation at
  // position p (nw null: copied), stored as T to dst and, when set, to dst2.
  auto prep = [&](const T* src, const T* nw, int p, T* dst, T* dst2) {
    float a[P], b[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      a[k] = static_cast<float>(src[lane + 32 * k]);
      b[k] = static_cast<float>(src[lane + 32 * k + D / 2]);
    }
    if (nw == nullptr) {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        dst[lane + 32 * k] = static_cast<T>(a[k]);
        dst[lane + 32 * k + D / 2] = static_cast<T>(b[k]);
        if (dst2 != nullptr) {
          dst2[lane + 32 * k] = static_cast<T>(a[k]);
          dst2[lane + 32 * k + D / 2] = static_cast<T>(b[k]);
        }
      }
      return;
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) ss += a[k] * a[k] + b[k] * b[k];
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, sh);
    const float r = rsqrtf(ss / D + eps[0]);
    const float fp = static_cast<float>(p);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = lane + 32 * k;
      const float na = static_cast<float>(static_cast<T>(a[k] * r * static_cast<float>(nw[i])));
      const float nb = static_cast<float>(static_cast<T>(b[k] * r * static_cast<float>(nw[i + D / 2])));
      float sn, cs;
      sincosf(fp * inv[i], &sn, &cs);
      const T ra = static_cast<T>(na * cs - nb * sn);
      const T rb = static_cast<T>(na * sn + nb * cs);
      dst[i] = ra;
      dst[i + D / 2] = rb;
      if (dst2 != nullptr) {
        dst2[i] = ra;
        dst2[i + D / 2] = rb;
      }
    }
  };
  T* const kc = const_cast<T*>(ck) + (size_t)hk * R * D;
  T* const vc = const_cast<T*>(cv) + (size_t)hk * R * D;
  if (wid == 0) prep(y + (size_t)l * ystride + QO + h * D, qn, pos + l, qt, nullptr);
  for (int r = wid; r < rows; r += WARPS) { // warp-uniform
    const T* src = y + (size_t)r * ystride;
    const bool store = writer && r == l && pos + r >= 0 && pos + r < R;
    prep(src + KO + hk * D, kn, pos + r, &kr_s[r][0], store ? kc + (size_t)(pos + r) * D : nullptr);
    prep(src + VO + hk * D, nullptr, 0, &vr_s[r][0], store ? vc + (size_t)(pos + r) * D : nullptr);
  }
  __syncthreads();
  const float sc = scale[0];
  for (int d = threadIdx.x; d < D; d += WARPS * 32) qs[d] = static_cast<float>(qt[d]) * sc;
  __syncthreads();
  // From here the few-query attention kernel's loop, keys and values before pos read from
  // the cache and the block's from shared memory.
  float m = NEG_INF;
  float lsum = 0.0f;
  float o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
  for (int t0 = wid * 32; t0 < n; t0 += WARPS * 32) { // warp-uniform
    const int j = t0 + lane;
    float s = NEG_INF;
    if (j < n) {
      const T* kr = j < pos ? kc + (size_t)j * D : &kr_s[j - pos][0];
      float acc = 0.0f;
#pragma unroll
      for (int d = 0; d < D; d += 8) {
        uint4 raw = *reinterpret_cast<const uint4*>(kr + d);
        const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(qs[d + e], static_cast<float>(p[e]), acc);
      }
      s = acc;
    }
    float tmax = s;
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, sh));
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew);
    const float p = (j < n) ? expf(s - mnew) : 0.0f;
    float psum = p;
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, sh);
    lsum = lsum * corr + psum;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] *= corr;
    const int last = min(32, n - t0);
    for (int j0 = 0; j0 < last; j0 += 8) {
      VecT vv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int r = t0 + min(j0 + u, last - 1);
        const T* vr = r < pos ? vc + (size_t)r * D : &vr_s[r - pos][0];
        vv[u] = *reinterpret_cast<const VecT*>(vr + lane * DPL);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float pj = __shfl_sync(0xffffffffu, p, j0 + u);
        if (j0 + u < last) {
#pragma unroll
          for (int i = 0; i < DPL; ++i) o[i] = fmaf(pj, static_cast<float>(vv[u].e[i]), o[i]);
        }
      }
    }
    m = mnew;
  }
  if (lane == 0) {
    wm[wid] = m;
    wl[wid] = lsum;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) wo[wid][lane * DPL + i] = o[i];
  __syncthreads();
  if (wid == 0) {
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) M = fmaxf(M, wm[w]);
    float total = 0.0f;
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = wm[w] == NEG_INF ? 0.0f : expf(wm[w] - M);
      total += wl[w] * f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] += wo[w][lane * DPL + i] * f;
    }
    T* op = out + ((size_t)l * HQ + h) * D + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) op[i] = static_cast<T>(acc[i] / total);
  }
`

// prepAttnMaxRows is the most block rows the kernel keeps in shared memory (a verify block
// of 16 tokens; 16 KB of keys and values at D = 256).
const prepAttnMaxRows = 16

// newPrepAttention makes the kernel when DFLASH_FUSE_PREP_ATTN=1, nil otherwise.
func newPrepAttention() *mlxc.Kernel {
	if os.Getenv("DFLASH_FUSE_PREP_ATTN") != "1" {
		return nil
	}
	return mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_prep_attention",
		Inputs:  []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv", "scale"},
		Outputs: []string{"out"}, Source: prepAttnSource, EnsureRowContiguous: false})
}

// PrepAttentionFits reports whether PrepAttention serves a block of rows x [L, ·] (whose
// merged q/k/v product it takes; PrepFits's conditions) with head size D and cache buffers
// ck [1, hk, R, D]: the kernel is on and L ≤ 16.
func (f *Fused) PrepAttentionFits(x *mlxc.Array, D int, qn, kn, ck *mlxc.Array) bool {
	return f != nil && f.prepAttn != nil && f.PrepFits(x, D, qn, kn) && x.Dim(0) <= prepAttnMaxRows &&
		ck != nil && ck.Ndim() == 4 && ck.Dim(3) == D && ck.Dtype() == x.Dtype()
}

// PrepAttention returns the attention rows [L, hq·D] of a block from its merged q/k/v
// product y [L, (hq+2·hk)·D], writing its keys and values into the cache buffers ck, cv
// [1, hk, R, D] at rows pos..pos+L−1 (rows past R dropped): HeadPrepInto followed by
// FewQueryAttention.Apply over the cache, bit for bit, in one kernel. causal: row i sees
// keys [0, pos+i+1); otherwise every row sees [0, pos+L). pos must be OnDevice's; scale is
// the model's 1/√D as a 0-d float32 array (OnDeviceConst).
func (f *Fused) PrepAttention(y *mlxc.Array, hq, hk, D int, qn, kn, pos, ck, cv, scale *mlxc.Array, causal bool) *mlxc.Array {
	L := y.Dim(0)
	dt := y.Dtype()
	return f.prepAttn.Call([]*mlxc.Array{y, qn, kn, f.inv, f.eps, pos, ck, cv, scale}, mlxc.KernelCall{
		OutputShapes: [][]int{{L, hq * D}},
		OutputDtypes: []mlxc.Dtype{dt},
		Grid:         [3]int{hq * L * fqaWarps * 32, 1, 1},
		ThreadGroup:  [3]int{fqaWarps * 32, 1, 1},
		Template: f.attnTemplates.get(prepAttnKey{dt, D, hq, hk, causal}, func() []mlxc.TemplateArg {
			return prepAttnTemplate(dt, D, hq, hk, causal)
		}),
	})[0]
}

type prepAttnKey struct {
	dt     mlxc.Dtype
	d      int
	hq, hk int
	causal bool
}

// prepAttnTemplate is the kernel's compile-time arguments (the offline compile check uses
// it too): q heads, then k, then v in the merged product's columns.
func prepAttnTemplate(dt mlxc.Dtype, D, hq, hk int, causal bool) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "HQ", Value: hq},
		{Name: "HK", Value: hk}, {Name: "QO", Value: 0}, {Name: "KO", Value: hq * D}, {Name: "VO", Value: (hq + hk) * D},
		{Name: "WARPS", Value: fqaWarps}, {Name: "CAUSAL", Value: causal}, {Name: "LMAX", Value: prepAttnMaxRows}}
}

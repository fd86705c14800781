  // The twin of FewQueryAttention's CUDA body (cuda/fqa_loop_decls.cuh, fqa_head.cuh and
  // fqa_loop.cuh with strided rows of k and v; not PrepAttention): threadgroup b = l·H + h
  // for query l of head h, WARPS SIMD groups of 32 lanes, grid (H·L·WARPS·32, 1, 1). The
  // query, scaled, goes to threadgroup memory; SIMD group w walks the key tiles of 32 from
  // w·32 in steps of WARPS·32 (lane j scores key t0+j, its sum over D in increasing d) with
  // an online softmax, and SIMD group 0 merges the groups in group order and writes row
  // l·H + h of out [L, H·D], DPL = D/32 outputs per lane, each rounded to T once. A row's
  // sums depend only on its query and its key count, never on L. off and scale are read at
  // element 0: the launch passes them as 1-element arrays (Metal binds a 0-d input as a
  // reference, which has no element 0).
  constexpr int DPL = D / 32;
  const float NEG_INF = -INFINITY;
  threadgroup float qs[D];
  threadgroup float wm[WARPS];
  threadgroup float wl[WARPS];
  threadgroup float wo[WARPS][D];
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int b = int(threadgroup_position_in_grid.x);
  const int h = b % H;
  const int l = b / H;
  if (l >= L) return; // threadgroup-uniform
  const int hk = h / (H / Hkv);
  const int tid = int(thread_position_in_threadgroup.x);
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int n = CAUSAL ? off[0] + l + 1 : off[0]; // keys this query sees
  const float sc = scale[0];
  const size_t qo = size_t(h) * q_strides[1] + size_t(l) * q_strides[2];
  for (int d = tid; d < D; d += WARPS * 32) qs[d] = static_cast<float>(q[qo + size_t(d) * q_strides[3]]) * sc;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const size_t kb = size_t(hk) * k_strides[1];
  const size_t vb = size_t(hk) * v_strides[1];
  const size_t kst = k_strides[2];
  const size_t vst = v_strides[2];
  float m = NEG_INF;
  float lsum = 0.0f;
  float o[DPL];
  for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
  for (int t0 = wid * 32; t0 < n; t0 += WARPS * 32) { // SIMD-group-uniform
    const int j = t0 + lane;
    float s = NEG_INF;
    if (j < n) {
      const size_t kr = kb + size_t(j) * kst;
      float acc = 0.0f;
      for (int d = 0; d < D; ++d) acc = fma(qs[d], static_cast<float>(k[kr + d]), acc);
      s = acc;
    }
    float tmax = s;
    for (ushort sh = 16; sh > 0; sh >>= 1) tmax = fmax(tmax, simd_shuffle_xor(tmax, sh));
    const float mnew = fmax(m, tmax); // finite: key t0 < n is in this tile
    const float corr = exp(m - mnew);
    const float p = j < n ? exp(s - mnew) : 0.0f;
    float psum = p;
    for (ushort sh = 16; sh > 0; sh >>= 1) psum += simd_shuffle_xor(psum, sh);
    lsum = lsum * corr + psum;
    for (int i = 0; i < DPL; ++i) o[i] *= corr;
    // The tile's values in key order: lane j's weight, broadcast, times each value row.
    const int last = min(32, n - t0);
    for (int u = 0; u < last; ++u) {
      const float pj = simd_shuffle(p, ushort(u));
      const size_t vr = vb + size_t(t0 + u) * vst + size_t(lane * DPL);
      for (int i = 0; i < DPL; ++i) o[i] = fma(pj, static_cast<float>(v[vr + i]), o[i]);
    }
    m = mnew;
  }
  if (lane == 0) {
    wm[wid] = m;
    wl[wid] = lsum;
  }
  for (int i = 0; i < DPL; ++i) wo[wid][lane * DPL + i] = o[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (wid == 0) {
    float M = NEG_INF;
    for (int w = 0; w < WARPS; ++w) M = fmax(M, wm[w]);
    float total = 0.0f;
    float acc[DPL];
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      const float f = wm[w] == NEG_INF ? 0.0f : exp(wm[w] - M); // a SIMD group with no keys adds nothing
      total += wl[w] * f;
      for (int i = 0; i < DPL; ++i) acc[i] += wo[w][lane * DPL + i] * f;
    }
    const size_t oo = (size_t(l) * H + h) * D + size_t(lane * DPL);
    for (int i = 0; i < DPL; ++i) out[oo + i] = static_cast<T>(acc[i] / total);
  }

  // Pass 1 of the split-key attention on tensor cores (m16n8k16 mma, sm_80 and later;
  // bf16 or f16): the same launch, inputs and partials as dflash_split_keys, so pass 2 is
  // shared. Block (c, hk) attends the G·L query rows of kv head hk (row r is query r / G
  // of head hk·G + r % G) to chunk c's keys [c·CHUNK, (c+1)·CHUNK). The block stages the
  // chunk's keys and values in shared memory KT at a time (rows past the keys any row sees
  // are zeros, never read from the buffers); each warp holds one tile of 16 rows (WARPS
  // tiles at once, more rows in further rounds) and computes S = q·kᵀ for the KT keys with
  // mma, scales it in float32, masks the keys a row does not see, runs the online softmax
  // per row (a row's 8 scores per lane in a fixed order, then across its 4 lanes, xor 1
  // then 2) and adds P·V with P rounded to T, as flash attention does. Every sum of a row
  // runs in an order that depends only on the row and the key tiles, never on the rows
  // beside it or on the launch's chunk count, so a one-row call and a block agree bit for
  // bit. Keys and values must be 16-byte aligned rows with unit stride in D (KV cache
  // views are). A row's partial (max m, sum l, unnormalised output o) goes to part_ml
  // [rows, S, 2] and part_o [rows, S, D]; a chunk past the keys a row sees leaves m = −inf.
  constexpr int KT = 32;      // keys per staged tile
  constexpr int PITCH = D + 8; // shared row pitch in elements: conflict-free fragment loads
  constexpr int KS = D / 16;  // mma k-steps of q·kᵀ
  constexpr int DT = D / 8;   // n-tiles of the output
  constexpr int VPR = D / 8;  // 16-byte vectors per key row
  struct Kind {
    __device__ static constexpr bool bf16(const __nv_bfloat16*) { return true; }
    __device__ static constexpr bool bf16(const void*) { return false; }
  };
  constexpr bool BF16 = Kind::bf16(static_cast<const T*>(nullptr));
  struct alignas(4) Pair {
    T lo, hi;
  };
  const float NEG_INF = __int_as_float((int)0xff800000u);
  __shared__ __align__(16) T ksm[KT][PITCH];
  __shared__ __align__(16) T vsm[KT][PITCH];
  // The launch geometry is spelled out as in dflash_split_keys: MLX gives a kernel the
  // shape and stride arguments whose names its body mentions, so a shared macro hides them.
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int G = H / Hkv;
  const int S = gridDim.x;
  const int c = blockIdx.x;
  const int hk = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int k0 = c * CHUNK;
  const int nrows = G * L;
  const int mtiles = (nrows + 15) / 16;
  const float sc = scale[0];
  const int visible = off[0];
  // The keys of this chunk the block's last row sees: the most any row sees.
  const int nblk = min(max((CAUSAL ? visible + L : visible) - k0, 0), CHUNK);
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const long long kst = k_strides[2];
  const long long vst = v_strides[2];
  auto pack = [](T lo, T hi) -> uint32_t {
    Pair p{lo, hi};
    return *reinterpret_cast<const uint32_t*>(&p);
  };
  for (int mg = 0; mg < mtiles; mg += WARPS) { // block-uniform
    const int mt = mg + wid;
    const bool active = mt < mtiles; // warp-uniform
    // The lane's two rows: g and g + 8 of the warp's tile.
    int row[2], nr[2];
    bool valid[2];
#pragma unroll
    for (int R = 0; R < 2; ++R) {
      const int r = mt * 16 + g + 8 * R;
      valid[R] = active && r < nrows;
      const int l = valid[R] ? r / G : 0;
      const int h = hk * G + (valid[R] ? r % G : 0);
      row[R] = l * H + h;
      const int n = valid[R] ? (CAUSAL ? visible + l + 1 : visible) : 0;
      nr[R] = min(max(n - k0, 0), CHUNK);
    }
    // q's fragments (A operand, rows g and g + 8, k = 16·ks + 2t + {0, 1} and + 8).
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int R = 0; R < 2; ++R) {
          T e0 = static_cast<T>(0.0f), e1 = static_cast<T>(0.0f);
          if (valid[R]) {
            const int r = mt * 16 + g + 8 * R;
            const T* qp = q + (hk * G + r % G) * q_strides[1] + (r / G) * q_strides[2];
            const int d = ks * 16 + half * 8 + 2 * t;
            e0 = qp[d * q_strides[3]];
            e1 = qp[(d + 1) * q_strides[3]];
          }
          qa[ks][half * 2 + R] = pack(e0, e1);
        }
      }
    }
    float m[2] = {NEG_INF, NEG_INF}, ls[2] = {0.0f, 0.0f};
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    }
    for (int t0 = 0; t0 < nblk; t0 += KT) { // block-uniform
      __syncthreads(); // the previous tile's readers are done
      for (int i = threadIdx.x; i < KT * VPR; i += WARPS * 32) {
        const int key = i / VPR;
        const int col = (i % VPR) * 8;
        uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
        if (t0 + key < nblk) {
          kv = *reinterpret_cast<const uint4*>(kb + (long long)(k0 + t0 + key) * kst + col);
          vv = *reinterpret_cast<const uint4*>(vb + (long long)(k0 + t0 + key) * vst + col);
        }
        *reinterpret_cast<uint4*>(&ksm[key][col]) = kv;
        *reinterpret_cast<uint4*>(&vsm[key][col]) = vv;
      }
      __syncthreads();
      if (!active) continue; // warp-uniform; the warp still takes part in the block's syncs
      // S for the tile's 4 groups of 8 keys: s[j] = (g, 8j+2t), (g, 8j+2t+1), (g+8, …), (g+8, …).
      float s[KT / 8][4];
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ksm[8 * j + g][16 * ks + 2 * t]);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ksm[8 * j + g][16 * ks + 8 + 2 * t]);
          if constexpr (BF16) {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(s[j][0]), "+f"(s[j][1]), "+f"(s[j][2]), "+f"(s[j][3])
                         : "r"(qa[ks][0]), "r"(qa[ks][1]), "r"(qa[ks][2]), "r"(qa[ks][3]), "r"(b0), "r"(b1));
          } else {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(s[j][0]), "+f"(s[j][1]), "+f"(s[j][2]), "+f"(s[j][3])
                         : "r"(qa[ks][0]), "r"(qa[ks][1]), "r"(qa[ks][2]), "r"(qa[ks][3]), "r"(b0), "r"(b1));
          }
        }
      }
      // Online softmax per row; p overwrites s.
#pragma unroll
      for (int R = 0; R < 2; ++R) {
        float tmax = NEG_INF;
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool seen = t0 + 8 * j + 2 * t + e < nr[R];
            s[j][2 * R + e] = seen ? s[j][2 * R + e] * sc : NEG_INF;
            tmax = fmaxf(tmax, s[j][2 * R + e]);
          }
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        // A row that sees no key of this tile keeps its state (its scores are all −inf,
        // so its p are 0); the shuffles run in every lane, outside any branch.
        const bool any = tmax != NEG_INF; // the same in the row's 4 lanes
        const float mnew = any ? fmaxf(m[R], tmax) : m[R];
        float psum = 0.0f;
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float si = s[j][2 * R + e];
            const float p = si == NEG_INF ? 0.0f : expf(si - mnew);
            s[j][2 * R + e] = p;
            psum += p;
          }
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        if (any) {
          const float corr = expf(m[R] - mnew);
          ls[R] = ls[R] * corr + psum;
#pragma unroll
          for (int j = 0; j < DT; ++j) {
            o[j][2 * R] *= corr;
            o[j][2 * R + 1] *= corr;
          }
          m[R] = mnew;
        }
      }
      // O += P·V over the tile's keys, 16 at a time (P's C fragments are its A fragments).
#pragma unroll
      for (int u = 0; u < KT / 16; ++u) {
        const uint32_t a0 = pack(static_cast<T>(s[2 * u][0]), static_cast<T>(s[2 * u][1]));
        const uint32_t a1 = pack(static_cast<T>(s[2 * u][2]), static_cast<T>(s[2 * u][3]));
        const uint32_t a2 = pack(static_cast<T>(s[2 * u + 1][0]), static_cast<T>(s[2 * u + 1][1]));
        const uint32_t a3 = pack(static_cast<T>(s[2 * u + 1][2]), static_cast<T>(s[2 * u + 1][3]));
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          const int dcol = 8 * j + g;
          const uint32_t b0 = pack(vsm[16 * u + 2 * t][dcol], vsm[16 * u + 2 * t + 1][dcol]);
          const uint32_t b1 = pack(vsm[16 * u + 8 + 2 * t][dcol], vsm[16 * u + 8 + 2 * t + 1][dcol]);
          if constexpr (BF16) {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(o[j][0]), "+f"(o[j][1]), "+f"(o[j][2]), "+f"(o[j][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
          } else {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(o[j][0]), "+f"(o[j][1]), "+f"(o[j][2]), "+f"(o[j][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
          }
        }
      }
    }
    if (active) {
#pragma unroll
      for (int R = 0; R < 2; ++R) {
        if (!valid[R]) continue;
        float* po = part_o + ((size_t)row[R] * S + c) * D + 2 * t;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          po[8 * j] = o[j][2 * R];
          po[8 * j + 1] = o[j][2 * R + 1];
        }
        if (t == 0) {
          part_ml[((size_t)row[R] * S + c) * 2] = m[R];
          part_ml[((size_t)row[R] * S + c) * 2 + 1] = ls[R];
        }
      }
    }
  }

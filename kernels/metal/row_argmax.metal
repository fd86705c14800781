  // The twin of cuda/row_argmax.cu: threadgroup r of NT = 1024 threads (32 SIMD groups)
  // takes row r of logits [R, V], grid (R·NT, 1, 1). Thread t scans elements t, t+NT, ... in
  // increasing order (four loads in flight) and keeps the first index of its largest value;
  // each SIMD group, then SIMD group 0 over the groups, picks the largest value and, among
  // equals, the smallest index (row_argmax.h): the row's first maximum. A row of −inf gives
  // index 0 (every thread starts at (−inf, 0)). With SUB each value is T(logits − lse),
  // computed in float and rounded to T: float holds more than twice T's bits, so that is
  // the correctly rounded T difference that MLX's Subtract gives. next[r] is the index and,
  // with DRAFTS, match[r] = (next[r] == drafts[r]) for r < len(drafts).
  constexpr int NT = 1024;
  threadgroup float wv[NT / 32];
  threadgroup uint wi[NT / 32];
  const int row = int(threadgroup_position_in_grid.x);
  const int tid = int(thread_position_in_threadgroup.x);
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int V = logits_shape[1];
  const size_t base = size_t(row) * size_t(V);
  float c = 0.0f;
  if (SUB) c = static_cast<float>(lse[row]); // lse is T then (exact); the unread stand-in int32 otherwise
  float best = -INFINITY;
  uint bi = 0;
  int i = tid;
  for (; i + 3 * NT < V; i += 4 * NT) {
    float x[4];
    for (int u = 0; u < 4; ++u) x[u] = static_cast<float>(logits[base + size_t(i + u * NT)]);
    for (int u = 0; u < 4; ++u) {
      const float y = SUB ? static_cast<float>(static_cast<T>(x[u] - c)) : x[u];
      dflash_am_take(best, bi, y, uint(i + u * NT));
    }
  }
  for (; i < V; i += NT) {
    const float x = static_cast<float>(logits[base + size_t(i)]);
    const float y = SUB ? static_cast<float>(static_cast<T>(x - c)) : x;
    dflash_am_take(best, bi, y, uint(i));
  }
  // The threadgroup's first maximum: per SIMD group, then across the groups.
  dflash_am_simd_best(best, bi);
  if (lane == 0) {
    wv[wid] = best;
    wi[wid] = bi;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (wid == 0) {
    best = wv[lane];
    bi = wi[lane];
    dflash_am_simd_best(best, bi);
    if (lane == 0) {
      next[row] = int(bi);
      if (DRAFTS) {
        if (row < drafts_shape[0]) match[row] = int(bi) == drafts[row];
      }
    }
  }

// Package engine runs generations: chunked prefill, then either plain autoregressive
// decoding (pipelined with async evaluation, like mlx-lm) or the DFlash loop
// (draft → verify → accept → rollback → emit, one host synchronisation per cycle). It
// applies stop rules (EOS, max tokens, stop strings, context limit, cancellation), streams
// events, and returns honest statistics. Worker serialises requests onto the MLX thread.
//
// Generate and friends must run on the MLX thread (inside mlxc.Do); Worker does that.
package engine

// Package engine runs generations: chunked prefill, then either plain autoregressive
// decoding (pipelined with async evaluation, like mlx-lm) or the DFlash loop
// (draft → verify → accept → rollback → emit, one host synchronisation per cycle). It
// applies stop rules (EOS, max tokens, stop strings, context limit, cancellation), streams
// events, and returns honest statistics. Worker serialises requests onto the MLX thread.
//
// The DFlash loop comes in two forms with the same output. dflash.go reads each cycle's
// acceptance before building the next (the draft of the next cycle is prefetched while
// the host streams). ahead.go (Engine.RunAhead; RunAheadFor: on with CUDA) builds and enqueues
// cycle k+1 from cycle k's device-side results — accepted count, next token, positions —
// and reads cycle k afterwards, so graph building overlaps the device. ProbePipeline
// measures the cycle time that overlap can reach (bench's "pipelined" figures).
//
// Generate and friends must run on the MLX thread (inside mlxc.Do); Worker does that.
package engine

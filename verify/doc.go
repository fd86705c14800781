// Package verify is one DFlash verification step: the interface a drafter implements
// (Proposer, so tests can plug in scripted drafters), the acceptance rules (greedy longest
// prefix; lossless speculative sampling for temperature > 0) built as lazy device graphs so
// the loop needs a single host synchronisation per cycle, and the host-side resolution of
// the accepted length and the next token. Rollback goes through the target's caches
// (model.Cache: Speculate before the verify, Commit of the accepted rows after), which each
// layer kind implements (a KV offset for attention; a snapshot and tape for recurrent layers).
package verify

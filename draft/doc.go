// Package draft is the DFlash drafter: a few Qwen3-shaped layers that read the target's
// hidden states (projected by fc + hidden_norm) as extra keys and values and denoise a
// block [staged, mask, …, mask] in one non-causal pass, embedding with the target's table
// and producing logits with the target's head. Its KV cache holds committed context only,
// so it never needs rollback. The package also holds the registry that maps target model
// IDs to their DFlash drafts.
package draft

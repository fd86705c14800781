package batchtest

// Prompt is a deterministic prompt of n tokens below vocab, different for each seed.
func Prompt(n, vocab int, seed uint32) []int32 {
	p := make([]int32, n)
	x := seed*2654435761 + 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		p[i] = int32(x % uint32(vocab))
	}
	return p
}

// Scenarios are the runs every family is checked with (vocab: the model's): rows of
// different prompt lengths (one of a single token, whose prefill is empty) decoded
// together; and rows joining and leaving mid-run, with a held step.
func Scenarios(vocab int) []Scenario {
	return []Scenario{
		Long(vocab),
		{Name: "mixed-lengths", Steps: 8, Rows: []Row{
			{Prompt: Prompt(1, vocab, 1), Join: 0, Leave: -1},
			{Prompt: Prompt(5, vocab, 2), Join: 0, Leave: -1},
			{Prompt: Prompt(12, vocab, 3), Join: 0, Leave: -1},
			{Prompt: Prompt(3, vocab, 4), Join: 0, Leave: -1},
		}},
		{Name: "join-leave-hold", Steps: 10, Hold: map[int][]int{4: {1}, 7: {1, 3}}, Rows: []Row{
			{Prompt: Prompt(9, vocab, 5), Join: 0, Leave: 3},
			{Prompt: Prompt(2, vocab, 6), Join: 0, Leave: -1},
			{Prompt: Prompt(17, vocab, 7), Join: 2, Leave: 6},
			{Prompt: Prompt(4, vocab, 8), Join: 5, Leave: -1},
			{Prompt: Prompt(6, vocab, 9), Join: 6, Leave: 8},
		}},
	}
}

// Long is a scenario whose rows reach a few hundred positions (past the first kvStep
// buffer step), for the padded-keys path, whose masked tail then spans hundreds of keys.
func Long(vocab int) Scenario {
	return Scenario{Name: "long-rows", Steps: 4, Rows: []Row{
		{Prompt: Prompt(37, vocab, 11), Leave: -1},
		{Prompt: Prompt(300, vocab, 12), Leave: -1},
		{Prompt: Prompt(2, vocab, 13), Join: 1, Leave: 2},
	}}
}

// GPUTol bounds a batched row's logits and states against the row decoded alone on a GPU,
// relative to the largest magnitude: there a batch's products and attention take other
// kernels (and rounding) than one row's, so only the CPU promises bit-equal rows. Measured
// on an H200 (docs/perf/batching.md): Qwen3 at most 0.02; the Qwen3.5 hybrid 0.19 at 4 bits
// (B rows take MLX's quantized GEMM, one row its GEMV), 0.09 in GPU-exact mode. A row at
// a wrong position or reading another row's state differs by 0.4 and more.
const GPUTol = 1.0 / 4

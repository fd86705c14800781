package kernels

import _ "embed" // the CUDA sources below

// The pieces of the CUDA kernels, as files: a .cu file is a whole kernel body, a .cuh
// file a part that several bodies share or that one body is assembled from.
var (
	// tcMMA defines MMA(d, a0, a1, a2, a3, b0, b1): d += A·B for one m16n8k16 tile, with
	// the element type picked by the BF16 template argument; and LDW(p), a 16-byte weight
	// load that bypasses L1 (weights are read once; L1 is left to x).
	//go:embed cuda/tc_mma.cuh
	tcMMA string
	// tcMain is the tensor-core kernel up to the warps' partial tiles in part[][][];
	// tcStore (one block per column tile) or tcSplitStore (Split blocks per tile) writes
	// y from them. With SPLIT = 1 both read all of K and sum in the same order.
	//go:embed cuda/tc_main.cuh
	tcMain string
	// tcStore sums the warps' partials in warp order and writes y (one block per tile); with
	// ACT, y is silu(gate)·up [M, N/2] of the gate and up columns, each rounded to T first
	// and then as GatedAct rounds: the values GatedAct gives for this product, bit for bit
	// (a column's sum does not depend on which tile slot computed it).
	//go:embed cuda/tc_store.cuh
	tcStore string
	// tcSplitStore: each block writes its chunk's float partial (warps summed in warp order)
	// to ws [tiles·SPLIT, 16, C]; the last of a tile's SPLIT blocks to count itself in
	// cnt[ct] (an atomic add; the threadfence pattern of CUDA's reduction samples) sums the
	// chunks in chunk order, writes y and sets the count back to 0 for the next call. cnt and
	// ws belong to one weight (model.TCState: inputs MLX does not know are written), and dep
	// (unread: the weight's previous y) orders this launch after the weight's previous one:
	// MLX's CUDA graphs may run kernels without a data path between them at the same time,
	// so two launches must never use a count or a scratch buffer at once.
	//go:embed cuda/tc_split_store.cuh
	tcSplitStore string
	// tcNormOut (the split kernel with NormOut) follows tcSplitStore in each tile's last
	// block. The block stages its columns of the norm weight xw, writes the tile's sums of
	// squares per row to ws after the partials (8 lanes per row, then a fixed butterfly), and
	// waits until every tile's last block has: a barrier of the tiles' last blocks on one
	// 64-bit word of cnt, arrivals in the low half and a generation in the high half; the
	// last arriver clears the arrivals and bumps the generation in one atomic add, the others
	// poll the generation. Each of them then sums the tiles' sums per row (lanes over tiles,
	// then a fixed butterfly: the same float sums in every block), takes the row's scale
	// s = rsqrt(Σ/N + eps) as MLX's RMSNorm does (float32), and writes its own columns of
	// xn = T(xw·T(y·s)), MLX's RMSNorm's roundings, from the values it has just written to
	// y. Only tiles' last blocks wait, at most one per column tile but the last; the model's
	// normOutFits keeps them fewer than the block slots the GPU guarantees (159 for the 4B
	// shape's o projection against 264 on an H200), so the blocks still to run always find
	// one, and ndep (unread: the previous NormOut launch's y) keeps two such launches from
	// running at once. Tile 0's block writes the scales to ws after the sums.
	//go:embed cuda/tc_norm_out.cuh
	tcNormOut string

	// fqaLoopDecls declares what fqaLoop uses besides the block's rows and query: its
	// vector type, and the scaled query and the warps' partial results in shared memory.
	//go:embed cuda/fqa_loop_decls.cuh
	fqaLoopDecls string
	// fqaHead: the block's (head, query), its query scaled into shared memory, its keys'
	// and values' rows (kb, vb with strides kst, vst), which DFLASH_KEY_ROW and
	// DFLASH_VALUE_ROW name for fqaLoop.
	//go:embed cuda/fqa_head.cuh
	fqaHead string
	// fqaLoop is the attention from the online softmax on: each warp's keys in tiles of
	// 32, the warps merged in a fixed order, the row written. It reads key and value rows
	// through the head file's DFLASH_KEY_ROW / DFLASH_VALUE_ROW, so FewQueryAttention and
	// PrepAttention run one text.
	//go:embed cuda/fqa_loop.cuh
	fqaLoop string

	// headPrepHead picks one warp's (row, head) item: its source row, norm weight and
	// output.
	//go:embed cuda/head_prep_head.cuh
	headPrepHead string
	// prepIntoCache selects headPrepHead's variant for one merged q/k/v product y whose keys
	// and values go straight into the KV cache's buffers ck / cv ([1, HK, R, D],
	// row-contiguous) at cache row off[0]+row (rows past R are not written), in place: only
	// q is an output. MLX knows nothing of that write, so a reader of the buffers must
	// depend on this kernel through its q (the attention kernel takes it); a block's keys
	// and values then need no dynamic slice update, and no k and v outputs (each output is
	// host time per launch).
	//go:embed cuda/prep_into_cache.cuh
	prepIntoCache string
	// headPrepRow normalizes and rotates one warp's row of one head from src (nw null:
	// copies it) into dst and, when set, dst2, at position off[0]+row. PrepAttention runs
	// the same text for its rows, so both round alike.
	//go:embed cuda/head_prep_row.cuh
	headPrepRow string
	// kvPrepIntoHead copies qn into KVPrepInto's one output qo: MLX sees no data path in
	// a kernel's writes into its inputs, so the readers of the rows take qo as their q
	// norm weight.
	//go:embed cuda/kv_prep_into_head.cuh
	kvPrepIntoHead string

	// prepAttnHead declares the names the shared texts use (H, n, kb and vb the cache's
	// rows of this kv head, the block's rows in shared memory; DFLASH_KEY_ROW and
	// DFLASH_VALUE_ROW read the keys and values before the block from the cache and the
	// block's own from shared memory, the same sums in the same order) and opens the prep
	// lambda whose body is headPrepRow.
	//go:embed cuda/prep_attn_head.cuh
	prepAttnHead string
	// prepAttnRows closes the lambda, prepares the block's q row and the key and value
	// rows this query sees, the writer storing its own row into the cache, and scales q
	// as the attention kernel does.
	//go:embed cuda/prep_attn_rows.cuh
	prepAttnRows string

	// gated is silu(g)·u as GatedAct computes it, rounding to T after the sigmoid, after
	// g·sigmoid and after the product (where mlx-lm's ops round). Every kernel that
	// computes the activation includes this one definition: their values must agree bit
	// for bit.
	//go:embed cuda/gated.cuh
	gated string
	//go:embed cuda/gated_act.cu
	gatedAct string
	// padPosition fills the four elements of a position array from element 0 of a.
	//go:embed cuda/pad_position.cu
	padPosition string

	// rowArgmax: one block per row. Each thread scans its 16-byte chunks of the row in
	// increasing order (four loads in flight), then the elements past the last whole chunk,
	// and keeps the first index of its largest value; the block then picks the largest value
	// and, among equals, the smallest index, which is the row's first maximum whatever the
	// order the threads finished in. NaN counts as larger than every number (the first NaN
	// wins) and a row of −inf gives index 0, as MLX's ArgMax does.
	//go:embed cuda/row_argmax.cu
	rowArgmax string
	// rowLead: one thread; accepted = the number of leading true values of match,
	// tok = next[accepted].
	//go:embed cuda/row_lead.cu
	rowLead string

	// splitKeys is pass 1 of the split-key attention: per (key chunk, kv head) block, every
	// query row of the kv head against the chunk's keys, each row's partial softmax written
	// out; splitKeysMerge is pass 2, each row's partials merged in chunk order.
	//go:embed cuda/split_keys.cu
	splitKeys string
	//go:embed cuda/split_keys_merge.cu
	splitKeysMerge string
	// splitKeysMMA is pass 1 on tensor cores: the same partials, q·kᵀ and P·V as mma.
	//go:embed cuda/split_keys_mma.cu
	splitKeysMMA string

	// gatedDelta is the delta rule's state steps (decay, update: each rounded as MLX's ops
	// round them) and a warp's fixed-order row sum, for both GatedDeltaNet kernels.
	//go:embed cuda/gated_delta.cuh
	gatedDelta string
	// gatedDeltaTape: one warp per state row, its Dk/32 columns per lane in registers over
	// the block's T steps; y and the state out, and with TAPE the innovations δ.
	//go:embed cuda/gated_delta_tape.cu
	gatedDeltaTape string
	// gatedDeltaReplay: the same layout, the first steps of a tape (all of them, or with
	// COUNTED a device count) applied to a state.
	//go:embed cuda/gated_delta_replay.cu
	gatedDeltaReplay string
)

// tcHeader is the tensor-core kernels' header: the activation (for the GATED and ACT
// fusions) and the MMA and LDW macros.
var tcHeader = gated + tcMMA

// The kernels. Bodies made of several files are their concatenation in order.
var (
	// SkinnyGEMMTC is the tensor-core few-row product (x, w, r → y).
	SkinnyGEMMTC = Kernel{Name: "dflash_skinny_gemm_tc", CUDA: Source{Header: tcHeader, Body: tcMain + tcStore}}
	// SkinnyGEMMTCSplit is the tensor-core product with K split over blocks
	// (x, w, cnt, dep, r, ws → y).
	SkinnyGEMMTCSplit = Kernel{Name: "dflash_skinny_gemm_tc_split", CUDA: Source{Header: tcHeader, Body: tcMain + tcSplitStore}}
	// SkinnyGEMMTCSplitNorm is the split product also writing its output's RMSNorm
	// (x, w, cnt, dep, r, ws, xw, ndep → y, xn).
	SkinnyGEMMTCSplitNorm = Kernel{Name: "dflash_skinny_gemm_tc_split_norm",
		CUDA: Source{Header: tcHeader, Body: tcMain + tcSplitStore + tcNormOut}}
	// FewQueryAttention is attention for a block of few queries (q, k, v, off, scale → out).
	FewQueryAttention = Kernel{Name: "dflash_few_query_attention", CUDA: Source{Body: fqaLoopDecls + fqaHead + fqaLoop},
		Metal:    Source{Body: metalFewQueryAttention},
		Contract: Contract{Inputs: []string{"q", "k", "v", "off", "scale"}, Outputs: []string{"out"}, Template: []string{"T", "D", "WARPS", "CAUSAL"}}}
	// HeadPrep is q/k norm, rotation and the head-major layout of q, k and v
	// (q, k, v, qn, kn, inv, eps, off → qo, ko, vo).
	HeadPrep = Kernel{Name: "dflash_head_prep", CUDA: Source{Body: headPrepHead + headPrepRow}}
	// HeadPrepInto is HeadPrep for one merged product writing the keys and values into
	// the KV cache in place (y, qn, kn, inv, eps, off, ck, cv → qo).
	HeadPrepInto = Kernel{Name: "dflash_head_prep_into", CUDA: Source{Body: prepIntoCache + headPrepHead + headPrepRow}}
	// KVPrepInto is HeadPrepInto for a k|v product, whose one output is a copy of qn.
	KVPrepInto = Kernel{Name: "dflash_kv_prep_into", CUDA: Source{Body: prepIntoCache + kvPrepIntoHead + headPrepHead + headPrepRow}}
	// PrepAttention is HeadPrepInto and the few-query attention in one kernel
	// (y, qn, kn, inv, eps, off, ck, cv, scale → out).
	PrepAttention = Kernel{Name: "dflash_prep_attention",
		CUDA: Source{Body: fqaLoopDecls + prepAttnHead + headPrepRow + prepAttnRows + fqaLoop}}
	// GatedAct is silu(gate)·up over one merged gate/up product (gu → y).
	GatedAct = Kernel{Name: "dflash_gated_act", CUDA: Source{Header: gated, Body: gatedAct}}
	// PadPosition writes four copies of a position into device memory (a → out).
	PadPosition = Kernel{Name: "dflash_pad_position", CUDA: Source{Body: padPosition}}
	// RowArgmax is each row's argmax, optionally of T(logits − lse), and the drafts'
	// match (logits, lse, drafts → next, match).
	RowArgmax = Kernel{Name: "dflash_row_argmax", CUDA: Source{Body: rowArgmax},
		Metal:    Source{Header: metalRowArgmaxOrder, Body: metalRowArgmax},
		Contract: Contract{Inputs: []string{"logits", "lse", "drafts"}, Outputs: []string{"next", "match"}, Template: []string{"T", "SUB", "DRAFTS"}}}
	// RowLead is the number of accepted drafts and the token after them
	// (next, match → accepted, tok).
	RowLead = Kernel{Name: "dflash_row_lead", CUDA: Source{Body: rowLead},
		Metal:    Source{Body: metalRowLead},
		Contract: Contract{Inputs: []string{"next", "match"}, Outputs: []string{"accepted", "tok"}}}
	// SplitKeys is pass 1 of the split-key attention (q, k, v, off, scale → part_o,
	// part_ml); SplitKeysMerge is pass 2 (part_o, part_ml → out).
	SplitKeys = Kernel{Name: "dflash_split_keys", CUDA: Source{Body: splitKeys},
		Metal:    Source{Body: metalSplitKeys},
		Contract: Contract{Inputs: []string{"q", "k", "v", "off", "scale"}, Outputs: []string{"part_o", "part_ml"}, Template: []string{"T", "D", "WARPS", "ROWS", "CHUNK", "CAUSAL"}}}
	// SplitKeysMMA is pass 1 on tensor cores (CUDA only, sm_80 on; the same inputs and
	// partials as SplitKeys, so SplitKeysMerge serves both).
	SplitKeysMMA = Kernel{Name: "dflash_split_keys_mma", CUDA: Source{Body: splitKeysMMA},
		Contract: Contract{Inputs: []string{"q", "k", "v", "off", "scale"}, Outputs: []string{"part_o", "part_ml"}, Template: []string{"T", "D", "WARPS", "CHUNK", "CAUSAL"}}}
	SplitKeysMerge = Kernel{Name: "dflash_split_keys_merge", CUDA: Source{Body: splitKeysMerge},
		Metal:    Source{Body: metalSplitKeysMerge},
		Contract: Contract{Inputs: []string{"part_o", "part_ml"}, Outputs: []string{"out"}, Template: []string{"T", "D"}}}
	// GatedDeltaTape is the GatedDeltaNet recurrence over a block, also writing its tape
	// (q, k, v, g, beta, state → y, state_out, tape).
	GatedDeltaTape = Kernel{Name: "dflash_gated_delta_tape", CUDA: Source{Header: gatedDelta, Body: gatedDeltaTape},
		Metal:    Source{Header: metalGatedDelta, Body: metalGatedDeltaTape},
		Contract: Contract{Inputs: []string{"q", "k", "v", "g", "beta", "state"}, Outputs: []string{"y", "state_out", "tape"}, Template: []string{"InT", "TAPE"}}}
	// GatedDeltaReplay applies a tape's first steps to a state
	// (delta, k, g, state, count → state_out).
	GatedDeltaReplay = Kernel{Name: "dflash_gated_delta_replay", CUDA: Source{Header: gatedDelta, Body: gatedDeltaReplay},
		Metal:    Source{Header: metalGatedDelta, Body: metalGatedDeltaReplay},
		Contract: Contract{Inputs: []string{"delta", "k", "g", "state", "count"}, Outputs: []string{"state_out"}, Template: []string{"KT", "COUNTED"}}}
)

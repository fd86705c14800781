// Package settings is the one place that reads the DFLASH_* environment variables. It
// resolves them once into a typed Settings value, rejecting a value it cannot read, because
// a typo would otherwise run the default path while the user believes they chose another
// (a comparison of two variants would then compare one with itself). The model loaders,
// the drafter, the engine and the MLX runtime receive the value; nothing else reads the
// environment (TestNoOtherPackageReadsSettings).
package settings

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Settings is every setting of the engine, grouped by what it tunes.
type Settings struct {
	Runtime     Runtime     `json:"runtime"`
	Loop        Loop        `json:"loop"`
	Kernels     Kernels     `json:"kernels"`
	Diagnostics Diagnostics `json:"diagnostics"`
}

// Runtime is how the MLX runtime starts.
type Runtime struct {
	// Device (DFLASH_DEVICE): "" picks a GPU when libmlx has one, "cpu" or "gpu" forces one.
	Device string `json:"device"`
	// KernelDir (DFLASH_KERNEL_DIR): the folder for our CUDA kernels' content-addressed
	// source files; "" the user's cache folder, "off" keeps sources inline.
	KernelDir string `json:"kernel_dir"`
	// CompileCache (DFLASH_COMPILE_CACHE): the folder where CUDA kernels compiled by
	// NVRTC are kept for the next process; "" the user's cache folder, "off" none (every
	// process compiles its kernels again).
	CompileCache string `json:"compile_cache"`
	// CompileAhead (DFLASH_COMPILE_AHEAD): on a CUDA GPU, compile each new custom kernel
	// in a process of its own as soon as a graph holds it, so that MLX, which compiles one
	// kernel at a time as it evaluates, finds it compiled (needs the compile cache); and
	// run a first use's kernel self-checks at the same time, one process each, and compile
	// MLX's own fused kernels in processes that run the same compiled functions
	// (mlxc/fusedahead.go). Speed only.
	CompileAhead bool `json:"compile_ahead"`
}

// Loop is how the engine decodes.
type Loop struct {
	// RunAhead (DFLASH_RUN_AHEAD): the run-ahead DFlash loop; Auto uses it on CUDA GPUs.
	RunAhead Switch `json:"run_ahead"`
	// AdaptiveBlock (DFLASH_ADAPTIVE_BLOCK): each DFlash cycle picks its block size, up to
	// the drafter's or --block-size, from the acceptance so far and cycle costs measured
	// after loading, block 1 (a one-token step, no drafts) included, so that a backend
	// where a wide verify costs several one-token steps verifies narrow blocks or decodes
	// plainly. Auto and On adapt, for every target; Off pins the block. Speed only: the
	// output is the same whatever the block.
	AdaptiveBlock Switch `json:"adaptive_block"`
	// GPUExact makes verify blocks round every row as a one-token step does, so DFlash
	// equals plain decoding bit for bit on a GPU too. A semantic choice, so it is the
	// --gpu-exact option of run, bench and serve, not a variable.
	GPUExact bool `json:"gpu_exact"`
	// GPUExactAuto: the command left --gpu-exact unset, so loading the target decides
	// GPUExact: on for a CUDA GPU and an unquantized target (measured to cost nothing
	// there), off elsewhere (unmeasured on Metal; a quantized verify would go row by row).
	GPUExactAuto bool `json:"-"`
	// PrefillSliceMS (DFLASH_PREFILL_SLICE_MS): the most milliseconds a request joining a
	// running batch prefills between two decode steps of the other rows; a prompt the
	// measured prefill rate runs within it runs whole. Smaller keeps their tokens flowing
	// more evenly, larger admits the newcomer sooner. 0: the engine's default (250).
	// Speed only.
	PrefillSliceMS int `json:"prefill_slice_ms,omitempty"`
	// MaskDrafts (DFLASH_MASK_DRAFTS): a constrained request's greedy DFlash drafts are
	// chosen under the grammar, each position's the drafter's most likely token its mask
	// allows (from the drafter's top candidates), instead of the drafter's own choice,
	// which the masked verify rejects when the grammar forbids it. Auto and On mask, Off
	// does not. Speed only: greedy output is the masked target's argmax either way; sampled
	// drafts are never masked (the verify's correction needs the drafter's own q).
	MaskDrafts Switch `json:"mask_drafts"`
}

// Kernels picks our custom kernels (docs/gpu.md has each one's measurements). They apply
// only where custom kernels can run (CUDA, and Metal for the kernels with a Metal twin);
// elsewhere MLX's ops are used regardless.
type Kernels struct {
	// Mode (DFLASH_KERNELS): KernelsCheck runs each custom kernel once per device against
	// its fallback before a model uses it (the verdict is remembered in the user's cache);
	// KernelsTrust uses them unchecked; KernelsOff uses none.
	Mode KernelMode `json:"mode"`
	// Disabled names the kernels the first-use self-check turned off on this device, with
	// why (set by kernelcheck.Gate, never from the environment).
	Disabled map[string]string `json:"disabled,omitempty"`
	// SkinnyGEMM (DFLASH_SKINNY_GEMM): products of 2–16 rows through the tensor-core
	// kernel instead of cuBLAS.
	SkinnyGEMM bool `json:"skinny_gemm"`
	// TCRule (DFLASH_TC_RULE): the tensor-core kernel's launch shapes ("" the built-in
	// rule; syntax in model/tcrule.go, checked when a model loads).
	TCRule string `json:"tc_rule"`
	// TCTiled (DFLASH_TC_TILED): the tensor-core kernel's tiled weight copies; Auto makes
	// them within a share of the device's memory, On without that bound.
	TCTiled Switch `json:"tc_tiled"`
	// FQA (DFLASH_FQA): attention of verify blocks and drafts through the few-query kernel.
	FQA bool `json:"fqa"`
	// FQAWarps (DFLASH_FQA_WARPS): warps per block of the attention kernels: 2, 4, 8 or 16.
	FQAWarps int `json:"fqa_warps"`
	// SplitKeysFrom (DFLASH_SPLIT_KEYS_FROM): the key count from which the kernel
	// attention of a block takes the split-key kernels (0: never; GPU-exact mode never
	// does).
	SplitKeysFrom int `json:"split_keys_from"`
	// SplitKeysMMA (DFLASH_SPLIT_KEYS_MMA): pass 1 of the split-key attention on tensor
	// cores (CUDA; elsewhere the scalar kernel runs). On: on an H200 a Qwen3-4B DFlash
	// cycle at 32k keys took 13.2 ms against the scalar pass's 36.7 (docs/perf/attention.md).
	SplitKeysMMA bool `json:"split_keys_mma"`
	// BatchFQA (DFLASH_BATCH_FQA): a batched step whose rows take several tokens (batched
	// speculation) attends each row the few-query kernel fits through it (FQA on), as the
	// row run alone does, instead of MLX's attention per row, which on CUDA builds a cuDNN
	// plan for every new pair of block width and key length: one almost every step of a
	// batch (docs/perf/batched-speculation.md). Off: MLX's attention, its keys padded to
	// KVBucket. Speed only.
	BatchFQA bool `json:"batch_fqa"`
	// Fused (DFLASH_FUSED): the fused head-prep and activation kernels in the target.
	Fused bool `json:"fused"`
	// FusedDraft (DFLASH_FUSED_DRAFT): the same kernels in the drafter's block rows.
	FusedDraft bool `json:"fused_draft"`
	// FusedContext (DFLASH_FUSED_CONTEXT): the drafter's context keys and values from one
	// product and one kernel.
	FusedContext bool `json:"fused_context"`
	// FuseProducts (DFLASH_FUSE_PRODUCTS): the residual add in the tensor-core product.
	FuseProducts bool `json:"fuse_products"`
	// FuseAct (DFLASH_FUSE_ACT): silu(gate)·up written by the gate/up product.
	FuseAct bool `json:"fuse_act"`
	// FuseNorm (DFLASH_FUSE_NORM): the o and down products also write their RMSNorm.
	FuseNorm bool `json:"fuse_norm"`
	// FusePrepAttn (DFLASH_FUSE_PREP_ATTN): head prep and attention as one kernel.
	FusePrepAttn bool `json:"fuse_prep_attn"`
	// ArgmaxKernel (DFLASH_ARGMAX_KERNEL): the greedy verdict's argmax kernels.
	ArgmaxKernel bool `json:"argmax_kernel"`
	// DeltaNetKernel (DFLASH_DELTANET_KERNEL): the GatedDeltaNet recurrence and tape replay
	// through their kernels (CUDA, or the Metal twins) instead of a loop of MLX ops.
	DeltaNetKernel bool `json:"deltanet_kernel"`
	// QMMKernel (DFLASH_QMM_KERNEL): quantized products of 2–16 rows (verify blocks,
	// drafts) through the small-M kernel instead of MLX's quantized_matmul, whose kernels
	// are tuned for one row or large tiles. Auto and On use it on CUDA and Metal: on the
	// H200 a 4-bit Qwen3-4B's verify took 4.7 ms against 10.2 (docs/gpu.md).
	QMMKernel Switch `json:"qmm_kernel"`
	// KVBucket (DFLASH_KV_BUCKET): pads the keys of cuDNN attention (FQA off) to a
	// multiple of this; 0 exact lengths, KVBucketAuto the backend's default.
	KVBucket int `json:"kv_bucket"`
}

// KernelMode is how custom kernels are admitted: checked first, trusted, or off.
type KernelMode string

const (
	KernelsCheck KernelMode = "check"
	KernelsTrust KernelMode = "trust"
	KernelsOff   KernelMode = "off"
)

// Allowed reports whether the kernel named name may run: custom kernels are not off and
// the self-check has not disabled it. Every constructor of a kernel asks it.
func (k Kernels) Allowed(name string) bool {
	if k.Mode == KernelsOff {
		return false
	}
	_, off := k.Disabled[name]
	return !off
}

// KVBucketAuto asks for the backend's key bucket (model.KeyBucketDefault).
const KVBucketAuto = -1

// DefaultSplitKeysFrom is the key count from which blocks take the split-key attention
// kernels by default: on an H200, DFlash on the Qwen3-4B shape runs level at 4k keys and
// faster from there (501 against 316 tok/s at 8k), slower below (docs/perf/attention.md).
const DefaultSplitKeysFrom = 4096

// Diagnostics are measuring and debugging aids; none changes the tokens.
type Diagnostics struct {
	// GraphDump (DFLASH_GRAPH_DUMP): a file for one profiled cycle's graph nodes.
	GraphDump string `json:"graph_dump,omitempty"`
	// CPUProfile (DFLASH_CPUPROFILE): a file for the command's Go CPU profile.
	CPUProfile string `json:"cpu_profile,omitempty"`
	// HostProf (DFLASH_HOSTPROF): a file for bench's native host-stack samples.
	HostProf string `json:"host_prof,omitempty"`
	// HostProfUS (DFLASH_HOSTPROF_US): microseconds between those samples.
	HostProfUS int `json:"host_prof_us"`
	// ChatDebug (DFLASH_CHAT_DEBUG): chat prints each rendered prompt to stderr.
	ChatDebug bool `json:"chat_debug,omitempty"`
	// TokenizerDir (DFLASH_TOKENIZER_DIR): the Qwen3 tokenizer files for the demo models.
	TokenizerDir string `json:"tokenizer_dir,omitempty"`
}

// Switch is a setting with a backend-dependent default: Auto, On or Off.
type Switch int8

const (
	Auto Switch = iota
	On
	Off
)

func (s Switch) String() string {
	switch s {
	case On:
		return "on"
	case Off:
		return "off"
	}
	return "auto"
}

// MarshalJSON writes the switch as "auto", "on" or "off".
func (s Switch) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// Default is what an empty environment resolves to.
func Default() Settings {
	return Settings{
		Kernels: Kernels{
			Mode: KernelsCheck, SkinnyGEMM: true, FQA: true, FQAWarps: 4, SplitKeysFrom: DefaultSplitKeysFrom, SplitKeysMMA: true, BatchFQA: true, Fused: true, FusedDraft: true, FusedContext: true,
			FuseProducts: true, FuseAct: true, FuseNorm: true, FusePrepAttn: true, ArgmaxKernel: true,
			DeltaNetKernel: true, KVBucket: KVBucketAuto,
		},
		Diagnostics: Diagnostics{HostProfUS: 500},
		Runtime:     Runtime{CompileAhead: true},
	}
}

// FromEnv reads the process environment (Parse), warnings to stderr.
func FromEnv() (Settings, error) {
	s, warnings, err := Parse(os.LookupEnv, os.Environ())
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	return s, err
}

// A variable is one DFLASH_* setting: set applies a present value (unset keeps Default's).
type variable struct {
	name string
	set  func(s *Settings, v string) error
}

// removed names the variables of variants that lost their own measurements (docs/gpu.md)
// and were deleted with their kernels: setting one fails, since the run it asks for no
// longer exists.
var removed = map[string]string{
	"DFLASH_FUSE_GATED":    "the gated activation in the down product was slower (cycles 0.6–0.8 ms longer)",
	"DFLASH_FUSED_ADDNORM": "the fused add-norm kernel was no faster (verify 7.92 against 7.68 ms)",
	"DFLASH_MERGE_PROJ":    "merged projections without the fused kernels were no faster (the fused kernels merge them)",
}

// notSettings are DFLASH_* variables read by the tests and scripts, not by the engine:
// they draw no warning.
var notSettings = map[string]bool{
	"DFLASH_CLI_MAIN": true, "DFLASH_PYREF": true, "DFLASH_REQUIRE_REFERENCE": true,
	"DFLASH_NVRTC_ONLY": true, "DFLASH_NVRTC_SASS": true, "DFLASH_NVRTC_DIR": true,
	"DFLASH_LOAD_CLIENTS": true, "DFLASH_LOAD_SECONDS": true, "DFLASH_BASE_URL": true,
	"DFLASH_API_KEY": true, "DFLASH_MODEL": true, "DFLASH_SDK_STRICT_TOOLS": true,
	"DFLASH_HUB_TEST_HELPER": true, "DFLASH_TC_INMODEL": true, "DFLASH_TC_INMODEL_RULES": true,
	"DFLASH_TC_SWEEP": true, "DFLASH_AHEAD_DEBUG": true,
	// The CLI's own flags' variables (urfave/cli reads them with the flags).
	"DFLASH_TARGET_MODEL": true, "DFLASH_DRAFT_MODEL": true, "DFLASH_DIST_BACKEND": true,
	// The tensor-parallel tests' variable (engine/tp_test.go).
	"DFLASH_TP_DIR": true,
}

var variables = []variable{
	{"DFLASH_DEVICE", func(s *Settings, v string) error {
		switch d := strings.ToLower(v); d {
		case "", "cpu", "gpu":
			s.Runtime.Device = d
			return nil
		}
		return errors.New("want cpu or gpu (unset: a GPU when libmlx has one)")
	}},
	{"DFLASH_KERNEL_DIR", func(s *Settings, v string) error { s.Runtime.KernelDir = v; return nil }},
	{"DFLASH_COMPILE_CACHE", func(s *Settings, v string) error { s.Runtime.CompileCache = v; return nil }},
	{"DFLASH_COMPILE_AHEAD", boolVar(func(s *Settings) *bool { return &s.Runtime.CompileAhead })},
	{"DFLASH_RUN_AHEAD", switchVar(func(s *Settings) *Switch { return &s.Loop.RunAhead },
		"want 0 (the serial loop), 1 (the run-ahead loop) or unset (run-ahead on CUDA GPUs only)")},
	{"DFLASH_ADAPTIVE_BLOCK", switchVar(func(s *Settings) *Switch { return &s.Loop.AdaptiveBlock },
		"want 0 (the full block every cycle), 1 or unset (an adaptive block)")},
	{"DFLASH_MASK_DRAFTS", switchVar(func(s *Settings) *Switch { return &s.Loop.MaskDrafts },
		"want 0 (the drafter's own drafts under a constraint), 1 or unset (drafts chosen under the grammar)")},
	{"DFLASH_PREFILL_SLICE_MS", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errors.New("want milliseconds ≥ 1 (unset: 250)")
		}
		s.Loop.PrefillSliceMS = n
		return nil
	}},
	{"DFLASH_SKINNY_GEMM", func(s *Settings, v string) error {
		switch v {
		case "", "tc":
			s.Kernels.SkinnyGEMM = true
		case "0":
			s.Kernels.SkinnyGEMM = false
		case "1":
			return errors.New("the CUDA-core variant was removed (slower on the device than the tensor-core kernel); want tc or unset (the tensor-core kernel) or 0 (cuBLAS)")
		default:
			return errors.New("want tc or unset (the tensor-core kernel) or 0 (cuBLAS)")
		}
		return nil
	}},
	{"DFLASH_TC_RULE", func(s *Settings, v string) error { s.Kernels.TCRule = v; return nil }},
	{"DFLASH_TC_TILED", switchVar(func(s *Settings) *Switch { return &s.Kernels.TCTiled },
		"want 0 (row-major weights), 1 (tiled copies of every weight) or unset (tiled copies within 75% of the device's memory)")},
	{"DFLASH_FQA", boolVar(func(s *Settings) *bool { return &s.Kernels.FQA })},
	{"DFLASH_FQA_WARPS", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		switch n, _ := strconv.Atoi(v); n {
		case 2, 4, 8, 16:
			s.Kernels.FQAWarps = n
			return nil
		}
		return errors.New("want 2, 4, 8 or 16 warps per block (unset: 4)")
	}},
	{"DFLASH_SPLIT_KEYS_FROM", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a key count ≥ 0 (0: never split; unset: %d)", DefaultSplitKeysFrom)
		}
		s.Kernels.SplitKeysFrom = n
		return nil
	}},
	{"DFLASH_KERNELS", func(s *Settings, v string) error {
		switch m := KernelMode(strings.ToLower(v)); m {
		case "":
		case KernelsCheck, KernelsTrust, KernelsOff:
			s.Kernels.Mode = m
		default:
			return errors.New("want check (each kernel checked against its fallback once per device; the default), trust (no check) or off (MLX's ops only)")
		}
		return nil
	}},
	{"DFLASH_FUSED", boolVar(func(s *Settings) *bool { return &s.Kernels.Fused })},
	{"DFLASH_FUSED_DRAFT", boolVar(func(s *Settings) *bool { return &s.Kernels.FusedDraft })},
	{"DFLASH_FUSED_CONTEXT", boolVar(func(s *Settings) *bool { return &s.Kernels.FusedContext })},
	{"DFLASH_FUSE_PRODUCTS", boolVar(func(s *Settings) *bool { return &s.Kernels.FuseProducts })},
	{"DFLASH_FUSE_ACT", boolVar(func(s *Settings) *bool { return &s.Kernels.FuseAct })},
	{"DFLASH_FUSE_NORM", boolVar(func(s *Settings) *bool { return &s.Kernels.FuseNorm })},
	{"DFLASH_FUSE_PREP_ATTN", boolVar(func(s *Settings) *bool { return &s.Kernels.FusePrepAttn })},
	{"DFLASH_ARGMAX_KERNEL", boolVar(func(s *Settings) *bool { return &s.Kernels.ArgmaxKernel })},
	{"DFLASH_DELTANET_KERNEL", boolVar(func(s *Settings) *bool { return &s.Kernels.DeltaNetKernel })},
	{"DFLASH_SPLIT_KEYS_MMA", boolVar(func(s *Settings) *bool { return &s.Kernels.SplitKeysMMA })},
	{"DFLASH_BATCH_FQA", boolVar(func(s *Settings) *bool { return &s.Kernels.BatchFQA })},
	{"DFLASH_QMM_KERNEL", switchVar(func(s *Settings) *Switch { return &s.Kernels.QMMKernel },
		"want 0 (MLX's quantized_matmul), 1 or unset (the small-M kernel on CUDA and Metal)")},
	{"DFLASH_KV_BUCKET", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return errors.New("want a key count ≥ 0 (0: exact lengths; unset: 256 on CUDA, 0 elsewhere)")
		}
		s.Kernels.KVBucket = n
		return nil
	}},
	{"DFLASH_GRAPH_DUMP", func(s *Settings, v string) error { s.Diagnostics.GraphDump = v; return nil }},
	{"DFLASH_CPUPROFILE", func(s *Settings, v string) error { s.Diagnostics.CPUProfile = v; return nil }},
	{"DFLASH_HOSTPROF", func(s *Settings, v string) error { s.Diagnostics.HostProf = v; return nil }},
	{"DFLASH_HOSTPROF_US", func(s *Settings, v string) error {
		if v == "" {
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return errors.New("want microseconds between samples > 0 (unset: 500)")
		}
		s.Diagnostics.HostProfUS = n
		return nil
	}},
	{"DFLASH_CHAT_DEBUG", boolVar(func(s *Settings) *bool { return &s.Diagnostics.ChatDebug })},
	{"DFLASH_TOKENIZER_DIR", func(s *Settings, v string) error { s.Diagnostics.TokenizerDir = v; return nil }},
}

// boolVar reads 0 (off) or 1 (on); unset keeps the default.
func boolVar(field func(*Settings) *bool) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		switch v {
		case "":
		case "0":
			*field(s) = false
		case "1":
			*field(s) = true
		default:
			return fmt.Errorf("want 0 (off) or 1 (on; unset: %s)", onOff(*field(&defaults)))
		}
		return nil
	}
}

var defaults = Default()

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// switchVar reads 0 (Off), 1 (On) or unset (Auto).
func switchVar(field func(*Settings) *Switch, want string) func(*Settings, string) error {
	return func(s *Settings, v string) error {
		switch v {
		case "":
			*field(s) = Auto
		case "0":
			*field(s) = Off
		case "1":
			*field(s) = On
		default:
			return errors.New(want)
		}
		return nil
	}
}

// Names lists the variables Parse reads.
func Names() []string {
	out := make([]string, len(variables))
	for i, v := range variables {
		out[i] = v.name
	}
	return out
}

// Parse resolves the settings from lookup (os.LookupEnv in the program). environ (KEY=value
// entries, may be nil) is only searched for DFLASH_* names that are not settings: a removed
// variable is an error, any other unknown one a warning (the prefix is shared with the
// tests' and scripts' own variables, and a typo should be seen, not fatal). Every bad value
// is reported, each naming its variable and the accepted values.
func Parse(lookup func(string) (string, bool), environ []string) (Settings, []string, error) {
	s := Default()
	var errs []error
	for _, v := range variables {
		val, ok := lookup(v.name)
		if !ok {
			continue
		}
		if err := v.set(&s, val); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", v.name, val, err))
		}
	}
	known := map[string]bool{}
	for _, v := range variables {
		known[v.name] = true
	}
	var warnings []string
	names := []string{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "DFLASH_") && !known[name] && !notSettings[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case removed[name] != "":
			errs = append(errs, fmt.Errorf("%s was removed: %s", name, removed[name]))
		case name == "DFLASH_GPU_EXACT":
			warnings = append(warnings, "DFLASH_GPU_EXACT is not read: GPU-exact verification is the --gpu-exact option of run, bench and serve")
		default:
			warnings = append(warnings, fmt.Sprintf("%s is not a dflash-mlx setting (ignored); the settings: %s", name, strings.Join(Names(), ", ")))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s, warnings, err
	}
	return s, warnings, s.Validate()
}

// Validate checks a Settings value built in code (tests, flags) as Parse checks the
// environment's.
func (s Settings) Validate() error {
	var errs []error
	switch s.Runtime.Device {
	case "", "cpu", "gpu":
	default:
		errs = append(errs, fmt.Errorf("settings: device %q: want \"\", cpu or gpu", s.Runtime.Device))
	}
	for _, sw := range []struct {
		name string
		v    Switch
	}{{"run_ahead", s.Loop.RunAhead}, {"adaptive_block", s.Loop.AdaptiveBlock}, {"mask_drafts", s.Loop.MaskDrafts}, {"tc_tiled", s.Kernels.TCTiled}, {"qmm_kernel", s.Kernels.QMMKernel}} {
		if sw.v < Auto || sw.v > Off {
			errs = append(errs, fmt.Errorf("settings: %s %d: want Auto, On or Off", sw.name, sw.v))
		}
	}
	switch s.Kernels.FQAWarps {
	case 2, 4, 8, 16:
	default:
		errs = append(errs, fmt.Errorf("settings: fqa_warps %d: want 2, 4, 8 or 16", s.Kernels.FQAWarps))
	}
	switch s.Kernels.Mode {
	case "", KernelsCheck, KernelsTrust, KernelsOff:
	default:
		errs = append(errs, fmt.Errorf("settings: kernels mode %q: want check, trust or off", s.Kernels.Mode))
	}
	if s.Kernels.SplitKeysFrom < 0 {
		errs = append(errs, fmt.Errorf("settings: split_keys_from %d: want ≥ 0", s.Kernels.SplitKeysFrom))
	}
	if s.Kernels.KVBucket < KVBucketAuto {
		errs = append(errs, fmt.Errorf("settings: kv_bucket %d: want ≥ 0 or KVBucketAuto", s.Kernels.KVBucket))
	}
	if s.Diagnostics.HostProfUS <= 0 {
		errs = append(errs, fmt.Errorf("settings: host_prof_us %d: want > 0", s.Diagnostics.HostProfUS))
	}
	return errors.Join(errs...)
}

// ForTests is the settings of a `go test` run: Default, in GPU-exact mode when
// DFLASH_GPU_EXACT=1. A test binary has no --gpu-exact option, and the GPU test runs check
// DFlash against plain decoding bit for bit only in that mode, so the harness asks for it
// with this variable; the engine itself never reads it (Parse warns).
func ForTests() Settings {
	s := Default()
	s.Loop.GPUExact = os.Getenv("DFLASH_GPU_EXACT") == "1"
	return s
}

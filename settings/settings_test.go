package settings

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	def := Default()
	with := func(f func(*Settings)) Settings { s := Default(); f(&s); return s }
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Settings
		wantErr string // substring; "" = no error
		warn    string // substring of a warning; "" = none
	}{
		{name: "empty", want: def},
		{name: "empty values keep defaults", env: map[string]string{"DFLASH_FQA": "", "DFLASH_FQA_WARPS": "", "DFLASH_KV_BUCKET": ""}, want: def},
		{name: "device", env: map[string]string{"DFLASH_DEVICE": "CPU"}, want: with(func(s *Settings) { s.Runtime.Device = "cpu" })},
		{name: "bad device", env: map[string]string{"DFLASH_DEVICE": "tpu"}, wantErr: `DFLASH_DEVICE="tpu": want cpu or gpu`},
		{name: "kernel dir off", env: map[string]string{"DFLASH_KERNEL_DIR": "off"}, want: with(func(s *Settings) { s.Runtime.KernelDir = "off" })},
		{name: "compile cache off", env: map[string]string{"DFLASH_COMPILE_CACHE": "off"}, want: with(func(s *Settings) { s.Runtime.CompileCache = "off" })},
		{name: "no compiles ahead", env: map[string]string{"DFLASH_COMPILE_AHEAD": "0"}, want: with(func(s *Settings) { s.Runtime.CompileAhead = false })},
		{name: "run ahead off", env: map[string]string{"DFLASH_RUN_AHEAD": "0"}, want: with(func(s *Settings) { s.Loop.RunAhead = Off })},
		{name: "run ahead on", env: map[string]string{"DFLASH_RUN_AHEAD": "1"}, want: with(func(s *Settings) { s.Loop.RunAhead = On })},
		{name: "bad run ahead", env: map[string]string{"DFLASH_RUN_AHEAD": "maybe"}, wantErr: `DFLASH_RUN_AHEAD="maybe": want 0`},
		{name: "adaptive block off", env: map[string]string{"DFLASH_ADAPTIVE_BLOCK": "0"}, want: with(func(s *Settings) { s.Loop.AdaptiveBlock = Off })},
		{name: "adaptive block on", env: map[string]string{"DFLASH_ADAPTIVE_BLOCK": "1"}, want: with(func(s *Settings) { s.Loop.AdaptiveBlock = On })},
		{name: "prefill slice", env: map[string]string{"DFLASH_PREFILL_SLICE_MS": "40"}, want: with(func(s *Settings) { s.Loop.PrefillSliceMS = 40 })},
		{name: "prefill slice zero", env: map[string]string{"DFLASH_PREFILL_SLICE_MS": "0"}, wantErr: `DFLASH_PREFILL_SLICE_MS="0": want milliseconds ≥ 1`},
		{name: "bad adaptive block", env: map[string]string{"DFLASH_ADAPTIVE_BLOCK": "auto"}, wantErr: `DFLASH_ADAPTIVE_BLOCK="auto": want 0 (the full block every cycle)`},
		{name: "skinny tc", env: map[string]string{"DFLASH_SKINNY_GEMM": "tc"}, want: def},
		{name: "skinny off", env: map[string]string{"DFLASH_SKINNY_GEMM": "0"}, want: with(func(s *Settings) { s.Kernels.SkinnyGEMM = false })},
		{name: "skinny simt removed", env: map[string]string{"DFLASH_SKINNY_GEMM": "1"}, wantErr: "CUDA-core variant was removed"},
		{name: "tc rule", env: map[string]string{"DFLASH_TC_RULE": "wide=4/8/4p"}, want: with(func(s *Settings) { s.Kernels.TCRule = "wide=4/8/4p" })},
		{name: "tiled off", env: map[string]string{"DFLASH_TC_TILED": "0"}, want: with(func(s *Settings) { s.Kernels.TCTiled = Off })},
		{name: "tiled unbounded", env: map[string]string{"DFLASH_TC_TILED": "1"}, want: with(func(s *Settings) { s.Kernels.TCTiled = On })},
		{name: "bad tiled", env: map[string]string{"DFLASH_TC_TILED": "yes"}, wantErr: `DFLASH_TC_TILED="yes": want 0`},
		{name: "fqa off", env: map[string]string{"DFLASH_FQA": "0"}, want: with(func(s *Settings) { s.Kernels.FQA = false })},
		{name: "bad bool names default", env: map[string]string{"DFLASH_FQA": "off"}, wantErr: `DFLASH_FQA="off": want 0 (off) or 1 (on; unset: on)`},
		{name: "warps", env: map[string]string{"DFLASH_FQA_WARPS": "8"}, want: with(func(s *Settings) { s.Kernels.FQAWarps = 8 })},
		{name: "bad warps", env: map[string]string{"DFLASH_FQA_WARPS": "6"}, wantErr: "want 2, 4, 8 or 16"},
		{name: "bad warps word", env: map[string]string{"DFLASH_FQA_WARPS": "eight"}, wantErr: "want 2, 4, 8 or 16"},
		{name: "fusions off", env: map[string]string{"DFLASH_FUSED": "0", "DFLASH_FUSED_DRAFT": "0", "DFLASH_FUSED_CONTEXT": "0",
			"DFLASH_FUSE_PRODUCTS": "0", "DFLASH_FUSE_ACT": "0", "DFLASH_FUSE_NORM": "0", "DFLASH_FUSE_PREP_ATTN": "0", "DFLASH_ARGMAX_KERNEL": "0"},
			want: with(func(s *Settings) {
				k := &s.Kernels
				k.Fused, k.FusedDraft, k.FusedContext, k.FuseProducts, k.FuseAct, k.FuseNorm, k.FusePrepAttn, k.ArgmaxKernel = false, false, false, false, false, false, false, false
			})},
		{name: "deltanet kernel off", env: map[string]string{"DFLASH_DELTANET_KERNEL": "0"}, want: with(func(s *Settings) { s.Kernels.DeltaNetKernel = false })},
		{name: "bad deltanet kernel", env: map[string]string{"DFLASH_DELTANET_KERNEL": "yes"}, wantErr: `DFLASH_DELTANET_KERNEL="yes"`},
		{name: "split keys on tensor cores", env: map[string]string{"DFLASH_SPLIT_KEYS_MMA": "1"}, want: with(func(s *Settings) { s.Kernels.SplitKeysMMA = true })},
		{name: "split keys scalar", env: map[string]string{"DFLASH_SPLIT_KEYS_MMA": "0"}, want: with(func(s *Settings) { s.Kernels.SplitKeysMMA = false })},
		{name: "bad split keys mma", env: map[string]string{"DFLASH_SPLIT_KEYS_MMA": "on"}, wantErr: `DFLASH_SPLIT_KEYS_MMA="on"`},
		{name: "kernels trusted", env: map[string]string{"DFLASH_KERNELS": "trust"}, want: with(func(s *Settings) { s.Kernels.Mode = KernelsTrust })},
		{name: "kernels off", env: map[string]string{"DFLASH_KERNELS": "OFF"}, want: with(func(s *Settings) { s.Kernels.Mode = KernelsOff })},
		{name: "bad kernels mode", env: map[string]string{"DFLASH_KERNELS": "1"}, wantErr: `DFLASH_KERNELS="1": want check`},
		{name: "qmm kernel off", env: map[string]string{"DFLASH_QMM_KERNEL": "0"}, want: with(func(s *Settings) { s.Kernels.QMMKernel = Off })},
		{name: "qmm kernel on", env: map[string]string{"DFLASH_QMM_KERNEL": "1"}, want: with(func(s *Settings) { s.Kernels.QMMKernel = On })},
		{name: "bad qmm kernel", env: map[string]string{"DFLASH_QMM_KERNEL": "metal"}, wantErr: `DFLASH_QMM_KERNEL="metal": want 0 (MLX's quantized_matmul)`},
		{name: "kv bucket", env: map[string]string{"DFLASH_KV_BUCKET": "0"}, want: with(func(s *Settings) { s.Kernels.KVBucket = 0 })},
		{name: "bad kv bucket", env: map[string]string{"DFLASH_KV_BUCKET": "-3"}, wantErr: `DFLASH_KV_BUCKET="-3"`},
		{name: "bad kv bucket word", env: map[string]string{"DFLASH_KV_BUCKET": "big"}, wantErr: `DFLASH_KV_BUCKET="big"`},
		{name: "diagnostics", env: map[string]string{"DFLASH_GRAPH_DUMP": "/g", "DFLASH_CPUPROFILE": "/c", "DFLASH_HOSTPROF": "/h",
			"DFLASH_HOSTPROF_US": "100", "DFLASH_CHAT_DEBUG": "1", "DFLASH_TOKENIZER_DIR": "/t"},
			want: with(func(s *Settings) {
				s.Diagnostics = Diagnostics{GraphDump: "/g", CPUProfile: "/c", HostProf: "/h", HostProfUS: 100, ChatDebug: true, TokenizerDir: "/t"}
			})},
		{name: "bad host prof interval", env: map[string]string{"DFLASH_HOSTPROF_US": "0"}, wantErr: "DFLASH_HOSTPROF_US"},
		{name: "removed gated split", env: map[string]string{"DFLASH_FUSE_GATED": "1"}, wantErr: "DFLASH_FUSE_GATED was removed"},
		{name: "removed add-norm", env: map[string]string{"DFLASH_FUSED_ADDNORM": "1"}, wantErr: "DFLASH_FUSED_ADDNORM was removed"},
		{name: "removed merged projections", env: map[string]string{"DFLASH_MERGE_PROJ": "0"}, wantErr: "DFLASH_MERGE_PROJ was removed"},
		{name: "gpu exact is a flag", env: map[string]string{"DFLASH_GPU_EXACT": "1"}, want: def, warn: "--gpu-exact"},
		{name: "unknown warns", env: map[string]string{"DFLASH_FQAA": "0"}, want: def, warn: "DFLASH_FQAA is not a dflash-mlx setting"},
		{name: "test harness variable is quiet", env: map[string]string{"DFLASH_CLI_MAIN": "1"}, want: def},
		{name: "every bad value reported", env: map[string]string{"DFLASH_FQA": "x", "DFLASH_FUSED": "y"}, wantErr: "DFLASH_FUSED="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var environ []string
			for k, v := range tc.env {
				environ = append(environ, k+"="+v)
			}
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			got, warnings, err := Parse(lookup, environ)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("settings differ (-want +got):\n%s", diff)
			}
			joined := strings.Join(warnings, "\n")
			if tc.warn == "" && joined != "" || !strings.Contains(joined, tc.warn) {
				t.Fatalf("warnings %q, want %q", joined, tc.warn)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*Settings)
		wantErr string
	}{
		{"default", func(*Settings) {}, ""},
		{"gpu exact", func(s *Settings) { s.Loop.GPUExact = true }, ""},
		{"device", func(s *Settings) { s.Runtime.Device = "tpu" }, "device"},
		{"warps", func(s *Settings) { s.Kernels.FQAWarps = 0 }, "fqa_warps"},
		{"switch", func(s *Settings) { s.Loop.RunAhead = 7 }, "run_ahead"},
		{"qmm switch", func(s *Settings) { s.Kernels.QMMKernel = -1 }, "qmm_kernel"},
		{"bucket", func(s *Settings) { s.Kernels.KVBucket = -2 }, "kv_bucket"},
		{"kernels mode", func(s *Settings) { s.Kernels.Mode = "sometimes" }, "kernels mode"},
		{"interval", func(s *Settings) { s.Diagnostics.HostProfUS = 0 }, "host_prof_us"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Default()
			tc.edit(&s)
			err := s.Validate()
			if (err != nil) != (tc.wantErr != "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// The resolved settings print as JSON (bench --json, version --json) with switches by name.
func TestSettingsJSON(t *testing.T) {
	s := Default()
	s.Loop.RunAhead = Off
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"run_ahead":"off"`, `"tc_tiled":"auto"`, `"fqa_warps":4`, `"gpu_exact":false`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
}

// readsAllowed are the packages besides this one that may read DFLASH_* variables: the
// CLI, which resolves Settings once (FromEnv) and reads the tests' own variables, and the
// Python reference of the tests (internal/reftest), whose variables belong
// to `go test` runs, not to the engine.
var readsAllowed = []string{"settings", "cli", "internal/reftest", "third_party", "node_modules"}

// No package outside readsAllowed reads a DFLASH_* variable: the settings reach the code as
// values, so every one is validated in one place and shows in the resolved settings.
func TestNoOtherPackageReadsSettings(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			for _, a := range readsAllowed {
				if rel == a {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		checked++
		for _, use := range envReads(t, path) {
			bad = append(bad, rel+":"+use)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s", checked, root)
	}
	for _, b := range bad {
		t.Errorf("%s reads a DFLASH_* variable: add a field to settings.Settings and pass it in", b)
	}
}

// envReads lists the calls in a file to os.Getenv, os.LookupEnv or os.Environ (any function
// of those names) that name DFLASH_ in a string argument, or (Environ) any file that also
// spells DFLASH_, and the string constants naming DFLASH_ passed to them indirectly.
func envReads(t *testing.T, path string) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	consts := map[string]bool{} // identifiers bound to a string naming DFLASH_
	mentions := false
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				if v, err := strconv.Unquote(n.Value); err == nil && strings.Contains(v, "DFLASH_") {
					mentions = true
				}
			}
		case *ast.ValueSpec:
			for i, v := range n.Values {
				if lit, ok := v.(*ast.BasicLit); ok && strings.Contains(lit.Value, "DFLASH_") && i < len(n.Names) {
					consts[n.Names[i].Name] = true
				}
			}
		}
		return true
	})
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		var name string
		switch fn := call.Fun.(type) {
		case *ast.SelectorExpr:
			name = fn.Sel.Name
		case *ast.Ident:
			name = fn.Name
		}
		switch name {
		case "Getenv", "LookupEnv":
			for _, a := range call.Args {
				hit := false
				ast.Inspect(a, func(m ast.Node) bool {
					switch m := m.(type) {
					case *ast.BasicLit:
						hit = hit || strings.Contains(m.Value, "DFLASH_")
					case *ast.Ident:
						hit = hit || consts[m.Name]
					}
					return true
				})
				if hit {
					out = append(out, strconv.Itoa(fset.Position(call.Pos()).Line))
				}
			}
		case "Environ":
			if mentions {
				out = append(out, strconv.Itoa(fset.Position(call.Pos()).Line))
			}
		}
		return true
	})
	return out
}

// Allowed refuses every kernel with custom kernels off and the kernels the self-check
// disabled, and admits the rest in the check and trust modes.
func TestKernelsAllowed(t *testing.T) {
	for _, tc := range []struct {
		mode     KernelMode
		disabled map[string]string
		name     string
		want     bool
	}{
		{KernelsCheck, nil, "a", true},
		{KernelsTrust, nil, "a", true},
		{KernelsOff, nil, "a", false},
		{KernelsCheck, map[string]string{"a": "mismatch"}, "a", false},
		{KernelsCheck, map[string]string{"a": "mismatch"}, "b", true},
	} {
		k := Kernels{Mode: tc.mode, Disabled: tc.disabled}
		if got := k.Allowed(tc.name); got != tc.want {
			t.Errorf("mode %s disabled %v: Allowed(%q) = %v, want %v", tc.mode, tc.disabled, tc.name, got, tc.want)
		}
	}
}

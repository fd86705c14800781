package model

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Each custom CUDA kernel exists exactly where it can run: made on a CUDA GPU (and those
// with Metal twins on a Metal GPU too), absent elsewhere, and a nil (absent) kernel fits
// nothing, so the model keeps MLX's ops.
func TestCUDAKernelsAbsentOffCUDA(t *testing.T) {
	rope := &Rope{Dims: 128, Base: 1e6, Scale: 1, MScale: 1}
	bf16 := func(shape ...int) *mlxc.Array { return mlxc.Zeros(shape, mlxc.BFloat16) }
	cases := []struct {
		name    string
		make    func() (made bool, free func())
		nilFits func() bool
	}{
		{"few-row product", func() (bool, func()) { s := newSkinnyGEMM(); return s != nil, s.Free },
			func() bool { var s *SkinnyGEMM; return s.Fits(bf16(4, 64), bf16(8, 64)) }},
		{"few-query attention", func() (bool, func()) { a := newFewQueryAttention(); return a != nil, a.Free },
			func() bool { var a *FewQueryAttention; q := bf16(1, 4, 3, 32); return a.Fits(q, q) }},
		{"row argmax", func() (bool, func()) { a := NewRowArgmax(settings.Default().Kernels); return a != nil, a.Free },
			func() bool { var a *RowArgmax; return a.Fits(bf16(2, 8)) }},
		{"fused layer kernels", func() (bool, func()) { f := newFused(rope, 128, 1e-6); return f != nil, f.Free },
			func() bool { var f *Fused; return f.PrepFits(bf16(2, 256), 128, bf16(128), bf16(128)) }},
	}
	err := mlxc.Do(func() error {
		gpu := mlxc.CUDAKernelsAvailable() && mlxc.CurrentDevice().GPU
		metal := mlxc.MetalKernelsAvailable() && mlxc.CurrentDevice().GPU
		twins := map[string]bool{"few-query attention": true, "row argmax": true} // made on Metal too
		for _, c := range cases {
			made, free := c.make()
			free()
			if want := gpu || metal && twins[c.name]; made != want {
				return fmt.Errorf("%s: made %v with CUDA kernels available %v, Metal kernels %v", c.name, made, gpu, metal)
			}
			if c.nilFits() {
				return fmt.Errorf("%s: an absent kernel fits", c.name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// onCUDA runs f on the MLX thread when custom CUDA kernels can run here, and skips the test
// otherwise.
func onCUDA(t *testing.T, f func() error) {
	t.Helper()
	if !mlxc.CUDAKernelsAvailable() {
		t.Skip("needs the CUDA backend and a GPU")
	}
	if err := mlxc.Do(f); err != nil {
		t.Fatal(err)
	}
}

// cudaType is the CUDA element type MLX declares for dt.
func cudaType(dt mlxc.Dtype) string {
	if dt == mlxc.BFloat16 {
		return "__nv_bfloat16"
	}
	return "__half"
}

// constsOf writes template arguments the way MLX's kernel wrapper declares them.
func constsOf(args []mlxc.TemplateArg) []string {
	var out []string
	for _, a := range args {
		switch v := a.Value.(type) {
		case int:
			out = append(out, fmt.Sprintf("constexpr int %s = %d;", a.Name, v))
		case bool:
			out = append(out, fmt.Sprintf("constexpr bool %s = %v;", a.Name, v))
		case mlxc.Dtype:
			out = append(out, fmt.Sprintf("using %s = %s;", a.Name, cudaType(v)))
		}
	}
	return out
}

// tcInputs is the tensor-core kernel's inputs: in and the residual r, of type T when the
// launch adds it and the unread float placeholder otherwise, then for a split launch its
// scratch ws, then with NormOut the norm's weight xw and the unread ordering input ndep
// (SkinnyGEMM.applyTC).
func tcInputs(in [][2]string, c tcConfig, T string) [][2]string {
	r := "float"
	if c.Resid {
		r = T
	}
	out := append(append([][2]string(nil), in...), [2]string{"r", r})
	if c.Split > 1 {
		out = append(out, [2]string{"ws", "float"})
	}
	if c.NormOut {
		out = append(out, [2]string{"xw", T}, [2]string{"ndep", T})
	}
	return out
}

type kernelCheck struct {
	Name    string      `json:"name"`
	Header  string      `json:"header"`
	Inputs  [][2]string `json:"inputs"`
	Outputs [][2]string `json:"outputs"`
	Consts  []string    `json:"consts"`
	Body    string      `json:"body"`
}

// Every custom CUDA kernel in this package compiles with NVRTC for sm_90, for each
// instantiation the code can request. NVRTC runs on the host, so this needs no GPU: `make
// check-kernels` installs NVRTC and the CUDA headers from PyPI and sets DFLASH_NVRTC_DIR
// (CI runs it). Whether the kernels compute the right thing is checked on a GPU by
// TestSkinnyGEMMMatchesMatmul and TestFewQueryAttentionMatchesSDPA.
func TestCUDAKernelSourcesCompile(t *testing.T) {
	dir := os.Getenv("DFLASH_NVRTC_DIR")
	if dir == "" {
		t.Skip("DFLASH_NVRTC_DIR not set (make check-kernels)")
	}
	ks := kernelChecks(t, t.TempDir())
	js, err := json.Marshal(ks)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "kernels.json")
	if err := os.WriteFile(f, js, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("python3", filepath.Join("..", "scripts", "check_cuda_kernels.py"), f, dir).CombinedOutput()
	t.Logf("%s", strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("NVRTC rejected a kernel: %v", err)
	}
}

// kernelChecks lists every instantiation of the custom CUDA kernels the code can request,
// as NVRTC compiles them: the compile check and the source hashes loop over it.
func kernelChecks(t *testing.T, inc string) []kernelCheck {
	t.Helper()
	var ks []kernelCheck
	for _, dt := range []mlxc.Dtype{mlxc.BFloat16, mlxc.Float16} {
		T := cudaType(dt)
		xw := [][2]string{{"x", T}, {"w", T}}
		y := [][2]string{{"y", T}}
		for _, c := range []tcConfig{tcConfigFor(19456, 2560), tcConfigFor(2560, 9728), tcConfigFor(6144, 2560), {Tiles: 2, Warps: 16, Unroll: 4}, {Tiles: 1, Warps: 4, Unroll: 2},
			{Tiles: 2, Warps: 8, Unroll: 2, Pipe: true}, {Tiles: 4, Warps: 8, Unroll: 4, Pipe: true},
			{Tiles: 2, Warps: 8, Stages: 3, KT: 256}, {Tiles: 4, Warps: 8, Stages: 3, KT: 128}, {Tiles: 1, Warps: 8, Stages: 4, KT: 512},
			{Tiles: 4, Warps: 8, Unroll: 4, Tiled: true}, {Tiles: 2, Warps: 8, Unroll: 4, Tiled: true}, {Tiles: 2, Warps: 8, Unroll: 4, Pipe: true, Tiled: true}} {
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("skinny_tc_%s_%d_%d_%d_%v_%d_%d_%v", T, c.Tiles, c.Warps, c.Unroll, c.Pipe, c.Stages, c.KT, c.Tiled),
				Header: kernels.SkinnyGEMMTC.CUDA.Header, Inputs: tcInputs(xw, c, T), Outputs: y, Consts: constsOf(c.template(dt)), Body: kernels.SkinnyGEMMTC.CUDA.Body})
		}
		for _, c := range []tcConfig{{Tiles: 2, Warps: 4, Unroll: 4, Split: 5}, {Tiles: 4, Warps: 4, Unroll: 4, Pipe: true, Split: 19}, tcConfigFor(2560, 9728),
			{Tiles: 2, Warps: 8, Unroll: 2, Split: 8, Tiled: true}, {Tiles: 1, Warps: 4, Unroll: 4, Split: 3}} {
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("skinny_tc_split_%s_%d_%d_%d_%v_%d_%v", T, c.Tiles, c.Warps, c.Unroll, c.Pipe, c.Split, c.Tiled),
				Header: kernels.SkinnyGEMMTC.CUDA.Header, Inputs: tcInputs([][2]string{{"x", T}, {"w", T}, {"cnt", "int32_t"}, {"dep", T}}, c, T), Outputs: y,
				Consts: constsOf(c.template(dt)), Body: kernels.SkinnyGEMMTCSplit.CUDA.Body})
		}
		act := tcConfigFor(19456, 2560) // ApplyAct on the merged gate/up product
		act.Act = true
		ks = append(ks, kernelCheck{Name: "skinny_tc_act_" + T, Header: kernels.SkinnyGEMMTC.CUDA.Header, Inputs: tcInputs(xw, act, T), Outputs: y,
			Consts: constsOf(act.template(dt)), Body: kernels.SkinnyGEMMTC.CUDA.Body})
		act.Tiled = true
		ks = append(ks, kernelCheck{Name: "skinny_tc_act_tiled_" + T, Header: kernels.SkinnyGEMMTC.CUDA.Header, Inputs: tcInputs(xw, act, T), Outputs: y,
			Consts: constsOf(act.template(dt)), Body: kernels.SkinnyGEMMTC.CUDA.Body})
		// The fusion (ApplyFused) on the model's products: the residual add; the staged path
		// too.
		for _, c := range []tcConfig{tcConfigFor(2560, 4096), tcConfigFor(2560, 9728), tcConfigFor(6144, 2560), tcConfigFor(1024, 2560), {Tiles: 4, Warps: 8, Stages: 3, KT: 128}} {
			c.Resid = true
			body, in, out := kernels.SkinnyGEMMTC.CUDA.Body, xw, y
			if c.Split > 1 {
				body, in = kernels.SkinnyGEMMTCSplit.CUDA.Body, [][2]string{{"x", T}, {"w", T}, {"cnt", "int32_t"}, {"dep", T}}
			}
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("skinny_tc_fused_%s_%d_%d_%d_%v_%d_%d_%v", T, c.Tiles, c.Warps, c.Unroll, c.Pipe, c.Split, c.Stages, c.Resid),
				Header: kernels.SkinnyGEMMTC.CUDA.Header, Inputs: tcInputs(in, c, T), Outputs: out, Consts: constsOf(c.template(dt)), Body: body})
		}
		// The norm fusion: o and down writing their output's RMSNorm (split, with the
		// residual add).
		split := [][2]string{{"x", T}, {"w", T}, {"cnt", "int32_t"}, {"dep", T}}
		for _, c := range []tcConfig{tcConfigFor(2560, 4096), tcConfigFor(2560, 9728), {Tiles: 1, Warps: 2, Unroll: 4, Split: 7}} {
			c.Resid, c.NormOut, c.EpsBits = true, true, 0x358637bd
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("skinny_tc_normout_%s_%d_%d_%d", T, c.Tiles, c.Warps, c.Split), Header: kernels.SkinnyGEMMTC.CUDA.Header,
				Inputs: tcInputs(split, c, T), Outputs: [][2]string{{"y", T}, {"xn", T}},
				Consts: constsOf(c.template(dt)), Body: kernels.SkinnyGEMMTCSplitNorm.CUDA.Body})
		}
		for _, D := range []int{64, 128, 256} {
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("head_prep_%s_%d", T, D),
				Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"qn", T}, {"kn", T}, {"inv", "float"}, {"eps", "float"}, {"off", "int32_t"}},
				Outputs: [][2]string{{"qo", T}, {"ko", T}, {"vo", T}},
				Consts:  constsOf(headPrepTemplate(dt, D, 32, 8, 0, 32*D, 40*D)), Body: kernels.HeadPrep.CUDA.Body})
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("kv_prep_%s_%d", T, D), // Fused.KVPrep: no q heads
				Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"qn", T}, {"kn", T}, {"inv", "float"}, {"eps", "float"}, {"off", "int32_t"}},
				Outputs: [][2]string{{"qo", T}, {"ko", T}, {"vo", T}},
				Consts:  constsOf(headPrepTemplate(dt, D, 0, 8, 0, 0, 8*D)), Body: kernels.HeadPrep.CUDA.Body})
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("kv_prep_into_%s_%d", T, D), // Fused.KVPrepInto
				Inputs:  [][2]string{{"y", T}, {"qn", T}, {"kn", T}, {"inv", "float"}, {"eps", "float"}, {"off", "int32_t"}, {"ck", T}, {"cv", T}},
				Outputs: [][2]string{{"qo", T}},
				Consts:  constsOf(headPrepTemplate(dt, D, 0, 8, 0, 0, 8*D)), Body: kernels.KVPrepInto.CUDA.Body})
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("head_prep_into_%s_%d", T, D),
				Inputs:  [][2]string{{"y", T}, {"qn", T}, {"kn", T}, {"inv", "float"}, {"eps", "float"}, {"off", "int32_t"}, {"ck", T}, {"cv", T}},
				Outputs: [][2]string{{"qo", T}},
				Consts:  constsOf(headPrepTemplate(dt, D, 32, 8, 0, 32*D, 40*D)), Body: kernels.HeadPrepInto.CUDA.Body})
			warps := []int{fqaWarps}
			if D == 128 {
				warps = append(warps, 2, 8, 16) // DFLASH_FQA_WARPS
			}
			for _, w := range warps {
				for _, causal := range []bool{true, false} {
					ks = append(ks, kernelCheck{Name: fmt.Sprintf("prep_attention_%s_%d_%d_%v", T, D, w, causal),
						Inputs: [][2]string{{"y", T}, {"qn", T}, {"kn", T}, {"inv", "float"}, {"eps", "float"}, {"off", "int32_t"},
							{"ck", T}, {"cv", T}, {"scale", "float"}},
						Outputs: [][2]string{{"out", T}}, Consts: constsOf(prepAttnTemplate(dt, D, 32, 8, w, causal)), Body: kernels.PrepAttention.CUDA.Body})
					ks = append(ks, kernelCheck{Name: fmt.Sprintf("fqa_%s_%d_%d_%v", T, D, w, causal),
						Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"off", "int32_t"}, {"scale", "float"}},
						Outputs: [][2]string{{"out", T}}, Consts: constsOf(fqaTemplate(dt, D, w, causal)), Body: kernels.FewQueryAttention.CUDA.Body})
				}
			}
			for _, causal := range []bool{true, false} {
				ks = append(ks, kernelCheck{Name: fmt.Sprintf("split_keys_%s_%d_%v", T, D, causal),
					Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"off", "int32_t"}, {"scale", "float"}},
					Outputs: [][2]string{{"part_o", "float"}, {"part_ml", "float"}}, Consts: constsOf(splitKeysTemplate(dt, D, causal)), Body: kernels.SplitKeys.CUDA.Body})
				ks = append(ks, kernelCheck{Name: fmt.Sprintf("split_keys_mma_%s_%d_%v", T, D, causal),
					Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"off", "int32_t"}, {"scale", "float"}},
					Outputs: [][2]string{{"part_o", "float"}, {"part_ml", "float"}}, Consts: constsOf(splitKeysMMATemplate(dt, D, causal)), Body: kernels.SplitKeysMMA.CUDA.Body})
			}
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("split_keys_merge_%s_%d", T, D),
				Inputs: [][2]string{{"part_o", "float"}, {"part_ml", "float"}}, Outputs: [][2]string{{"out", T}},
				Consts: constsOf(splitMergeTemplate(dt, D)), Body: kernels.SplitKeysMerge.CUDA.Body})
		}
		ks = append(ks, kernelCheck{Name: "gated_act_" + T, Header: kernels.GatedAct.CUDA.Header, Inputs: [][2]string{{"gu", T}}, Outputs: y,
			Consts: constsOf(gatedActTemplate(dt, 9728)), Body: kernels.GatedAct.CUDA.Body})
		// The small-M quantized product (SmallMQuantMatmul): both widths, every group size,
		// and tile and warp counts qmmLayout picks (wide, narrow and short products).
		for _, bits := range []int{4, 8} {
			for _, gs := range []int{32, 64, 128} {
				for _, l := range [][2]int{{1, 8}, {2, 8}, {4, 8}, {4, 4}, {1, 2}, {1, 1}} {
					ks = append(ks, kernelCheck{Name: fmt.Sprintf("qmm_small_m_%s_%d_%d_%d_%d", T, bits, gs, l[0], l[1]),
						Inputs: [][2]string{{"x", T}, {"w", "uint32_t"}, {"scales", T}, {"biases", T}}, Outputs: y,
						Consts: constsOf(qmmTemplate(dt, bits, gs, l[0], l[1])), Body: kernels.QuantMatmulSmallM.CUDA.Body})
				}
			}
		}
	}
	ks = append(ks, kernelCheck{Name: "pad_position", Inputs: [][2]string{{"a", "int32_t"}}, Outputs: [][2]string{{"out", "int32_t"}}, Body: kernels.PadPosition.CUDA.Body})
	// RowArgmax: every element type, with and without the logsumexp (the int32 stand-in when
	// without) and the drafts; and Leading.
	for _, T := range []string{"__nv_bfloat16", "__half", "float"} {
		for _, f := range [][2]bool{{false, false}, {true, true}, {true, false}} {
			lse := "int32_t"
			if f[0] {
				lse = T
			}
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("row_argmax_%s_%v_%v", T, f[0], f[1]),
				Inputs:  [][2]string{{"logits", T}, {"lse", lse}, {"drafts", "int32_t"}},
				Outputs: [][2]string{{"next", "int32_t"}, {"match", "bool"}},
				Consts:  []string{"using T = " + T + ";", fmt.Sprintf("constexpr bool SUB = %v;", f[0]), fmt.Sprintf("constexpr bool DRAFTS = %v;", f[1])},
				Body:    kernels.RowArgmax.CUDA.Body})
		}
	}
	ks = append(ks, kernelCheck{Name: "row_lead", Inputs: [][2]string{{"next", "int32_t"}, {"match", "bool"}},
		Outputs: [][2]string{{"accepted", "int32_t"}, {"tok", "int32_t"}}, Body: kernels.RowLead.CUDA.Body})
	// The GatedDeltaNet kernels (deltanet.Kernels): the recurrence for every input type with
	// and without the tape (its placeholder output is float too), the replay for every key
	// type with a host (all steps) and a device count.
	for _, T := range []string{"__nv_bfloat16", "__half", "float"} {
		for _, tape := range []bool{true, false} {
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("gated_delta_tape_%s_%v", T, tape), Header: kernels.GatedDeltaTape.CUDA.Header,
				Inputs:  [][2]string{{"q", T}, {"k", T}, {"v", T}, {"g", "float"}, {"beta", T}, {"state", "float"}},
				Outputs: [][2]string{{"y", T}, {"state_out", "float"}, {"tape", "float"}},
				Consts:  []string{"using InT = " + T + ";", fmt.Sprintf("constexpr bool TAPE = %v;", tape)},
				Body:    kernels.GatedDeltaTape.CUDA.Body})
		}
		for _, counted := range []bool{true, false} {
			ks = append(ks, kernelCheck{Name: fmt.Sprintf("gated_delta_replay_%s_%v", T, counted), Header: kernels.GatedDeltaReplay.CUDA.Header,
				Inputs:  [][2]string{{"delta", "float"}, {"k", T}, {"g", "float"}, {"state", "float"}, {"count", "int32_t"}},
				Outputs: [][2]string{{"state_out", "float"}},
				Consts:  []string{"using KT = " + T + ";", fmt.Sprintf("constexpr bool COUNTED = %v;", counted)},
				Body:    kernels.GatedDeltaReplay.CUDA.Body})
		}
	}
	// The form NewKernel hands MLX on CUDA: body and header #included from files, the
	// shape and stride names the body uses listed beside the include.
	T := cudaType(mlxc.BFloat16)
	fqaIn := [][2]string{{"q", T}, {"k", T}, {"v", T}, {"off", "int32_t"}, {"scale", "float"}}
	body, hdr := mlxc.KernelSources(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "fqa", Inputs: []string{"q", "k", "v", "off", "scale"},
		Outputs: []string{"out"}, Source: kernels.FewQueryAttention.CUDA.Body}, inc)
	if !strings.HasPrefix(body, "#include") || !strings.Contains(body, "q_shape") || hdr != "" {
		t.Fatalf("fqa's body was not moved into a file: %q / %q", body, hdr)
	}
	ks = append(ks, kernelCheck{Name: "fqa_included", Inputs: fqaIn, Outputs: [][2]string{{"out", T}},
		Consts: constsOf(fqaTemplate(mlxc.BFloat16, 128, fqaWarps, true)), Body: body})
	gu := tcConfigFor(19456, 2560)
	body, hdr = mlxc.KernelSources(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "tc", Inputs: []string{"x", "w", "r"},
		Outputs: []string{"y"}, Source: kernels.SkinnyGEMMTC.CUDA.Body, Header: kernels.SkinnyGEMMTC.CUDA.Header}, inc)
	if !strings.HasPrefix(body, "#include") || !strings.HasPrefix(hdr, "#include") {
		t.Fatalf("the tensor-core kernel was not moved into files: %q / %q", body, hdr)
	}
	ks = append(ks, kernelCheck{Name: "skinny_tc_included", Header: hdr, Inputs: tcInputs([][2]string{{"x", T}, {"w", T}}, gu, T),
		Outputs: [][2]string{{"y", T}}, Consts: constsOf(gu.template(mlxc.BFloat16)), Body: body})
	return ks
}

package cli

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/hub"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// distBackends are --dist-backend's values: MLX's distributed backends.
var distBackends = []string{mlxc.BackendRing, mlxc.BackendJACCL, mlxc.BackendMPI, mlxc.BackendNCCL, mlxc.BackendAny}

// chat does not split a target yet: every rank would have to follow its user's turns in
// lockstep, as a split server's ranks follow rank 0's requests.
const noSplitChat = "chat cannot split a target over ranks yet (--dist-backend): split targets run with `run`, `bench` and `serve` (dflash-mlx launch -n N -- serve …)"

// checkDistBackend refuses an unknown --dist-backend ("" is none).
func checkDistBackend(b string) error {
	if b == "" || slices.Contains(distBackends, b) {
		return nil
	}
	return fmt.Errorf("--dist-backend %q: want one of %s (or none)", b, strings.Join(distBackends, ", "))
}

// joinRanks starts backend's group the way MLX's launcher configures it (MLX_RANK and
// MLX_HOSTFILE for the ring; see mlxc.InitDistributed) and checks that every rank loads
// the same thing: a rank whose checkpoint, drafter, build or settings differ from rank 0's
// is refused on every rank before any weight is read, since ranks that disagree would
// compute garbage or wait on each other forever. MLX thread.
func joinRanks(backend string, fingerprint [32]byte) (*model.Shard, error) {
	g, err := mlxc.InitDistributed(backend, true)
	if err != nil {
		return nil, fmt.Errorf("--dist-backend %s: %w", backend, err)
	}
	sh := &model.Shard{Group: g, Rank: g.Rank(), Size: g.Size()}
	words := make([]int32, len(fingerprint)/4)
	for i := range words {
		words[i] = int32(binary.LittleEndian.Uint32(fingerprint[4*i:]))
	}
	var all []int32
	if err := mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		all = mlxc.AllGather(mlxc.FromSlice(words, len(words)), g).Int32s()
	}); err != nil {
		g.Close()
		return nil, fmt.Errorf("rank %d of %d: comparing the ranks' models and settings: %w", sh.Rank, sh.Size, err)
	}
	var differ []string
	for r := 1; r < sh.Size; r++ {
		if !slices.Equal(all[r*len(words):(r+1)*len(words)], all[:len(words)]) {
			differ = append(differ, fmt.Sprint(r))
		}
	}
	if len(differ) > 0 {
		g.Close()
		return nil, fmt.Errorf("rank %d of %d: rank(s) %s loaded another checkpoint, drafter, build or settings than rank 0 (start every rank with the same models, flags and DFLASH_* settings)",
			sh.Rank, sh.Size, strings.Join(differ, ", "))
	}
	return sh, nil
}

// loadFingerprint names what every rank must agree on: this build, the target's and
// drafter's configs and tensor headers (names, dtypes, shapes, byte ranges), the settings
// and the load flags that change what is computed.
func loadFingerprint(cfg LoadConfig, st settings.Settings, tm, dm *hub.Model) ([32]byte, error) {
	h := sha256.New()
	fmt.Fprintf(h, "build %s\n", buildID())
	stJSON, err := json.Marshal(st)
	if err != nil {
		return [32]byte{}, err
	}
	fmt.Fprintf(h, "settings %s\nblock %d context %d window %d prompt cache %d\n", stJSON, cfg.MaxBlock, cfg.ContextLength, cfg.DraftWindow, cfg.PromptCache.Bytes)
	dirs := []string{tm.Dir}
	if dm != nil {
		dirs = append(dirs, dm.Dir)
	}
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "config.json"))
		if err != nil {
			return [32]byte{}, err
		}
		fmt.Fprintf(h, "config %d\n", len(b))
		h.Write(b)
		w, err := model.ReadWeightHeaders(dir)
		if err != nil {
			return [32]byte{}, err
		}
		names := make([]string, 0, len(w.Info))
		for n := range w.Info {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			t := w.Info[n]
			fmt.Fprintf(h, "%s %s %v %d\n", n, t.Dtype, t.Shape, t.End-t.Begin)
		}
		// Two checkpoints of one shape (a fine-tune of the same base) differ in their
		// values: a sample of each file's bytes tells them apart without reading them whole.
		files, err := model.ShardFiles(dir)
		if err != nil {
			return [32]byte{}, err
		}
		for _, f := range files {
			if err := sampleFile(h, f); err != nil {
				return [32]byte{}, err
			}
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// sampleFile writes f's size and up to 64 KiB from each of its start, middle and end to h.
func sampleFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	const n = 64 << 10
	fmt.Fprintf(h, "file %d\n", fi.Size())
	buf := make([]byte, n)
	for _, off := range []int64{0, max(fi.Size()/2-n/2, 0), max(fi.Size()-n, 0)} {
		k, err := f.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			return err
		}
		h.Write(buf[:k])
	}
	return nil
}

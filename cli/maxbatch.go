package cli

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// The default batch of `serve`: as many rows as half the memory left after the weights
// holds, each row's attention cache sized for a typical request, between 1 and
// maxDefaultBatch. Rows beyond what the memory holds would fail mid-request; rows beyond
// maxDefaultBatch add latency to every row for little throughput on most devices.
const (
	maxDefaultBatch  = 32
	typicalRowTokens = 8192
	unknownMemBatch  = 8
)

// maxBatchFlag turns --max-batch into the scheduler's batch size and says where it came
// from (printed at start).
func maxBatchFlag(n int, s *Session) (int, string, error) {
	switch {
	case n < 0:
		return 0, "", fmt.Errorf("--max-batch %d: give 1 or more (0 chooses from the device's memory)", n)
	case n > 0:
		return n, "--max-batch", nil
	}
	var mem int64
	if err := mlxc.Do(func() error { mem = deviceMemory(); return nil }); err != nil {
		return 0, "", err
	}
	a := s.Engine.Target.Arch()
	perTok := kvBytesPerToken(a)
	rowTokens := min(s.Engine.ContextLen(), typicalRowTokens)
	if mem <= 0 {
		return unknownMemBatch, "the device's memory is unknown; set --max-batch", nil
	}
	rows := defaultMaxBatch(mem, a.WeightBytes, perTok, rowTokens)
	return rows, fmt.Sprintf("%.0f GiB of memory, %.0f KiB of cache per token, rows of %d tokens; --max-batch sets it",
		float64(mem)/(1<<30), float64(perTok)/1024, rowTokens), nil
}

// defaultMaxBatch is the rows whose caches of rowTokens positions fit in half the memory
// the weights leave, clamped to [1, maxDefaultBatch].
func defaultMaxBatch(mem, weights, perTok int64, rowTokens int) int {
	free := (mem - weights) / 2
	if perTok <= 0 || rowTokens <= 0 || free <= 0 {
		return 1
	}
	return int(min(max(free/(perTok*int64(rowTokens)), 1), maxDefaultBatch))
}

// kvBytesPerToken is the attention cache one position of one row takes: keys and values
// of every attention layer in the activation dtype. A hybrid (recurrent) target has one
// attention layer in four (Qwen3.5's full_attention_interval); its recurrent state is a
// fixed size per row, small beside a long row's keys.
func kvBytesPerToken(a model.Arch) int64 {
	layers := a.NumLayers
	if !a.TrimmableCache {
		layers = max(layers/4, 1)
	}
	return int64(layers) * 2 * int64(a.NumKVHeads) * int64(a.HeadDim) * int64(a.Dtype.Size())
}

// deviceMemory is the memory MLX computes in: the GPU's (Metal's recommended working set,
// or its size; CUDA's total), else the machine's; 0 when unknown.
func deviceMemory() int64 {
	d := mlxc.CurrentDevice()
	if d.GPU {
		info := mlxc.DeviceInfo(d)
		for _, k := range []string{"max_recommended_working_set_size", "memory_size", "total_memory"} {
			if n, err := strconv.ParseInt(strings.TrimSpace(info[k]), 10, 64); err == nil && n > 0 {
				return n
			}
		}
		return 0
	}
	return machineMemory()
}

// machineMemory is MemTotal from /proc/meminfo (Linux), 0 elsewhere.
func machineMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// decodeOne runs one request through the decoder as its only row (decoder.go): plain
// decoding, or speculation through the engine's proposer.
func (e *Engine) decodeOne(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	mlxc.ResetPeakMemory()
	q := e.newSequence(ctx, req, emit, time.Now(), false)
	b := e.newBatcher(1, 0)
	defer b.free()
	b.admit(q)
	for !b.empty() {
		if err := b.iterate(); err != nil {
			break // q carries the error
		}
	}
	return q.result()
}

package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// plain is autoregressive decoding of one request: the decoder with one row (decoder.go).
func (e *Engine) plain(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	mlxc.ResetPeakMemory()
	q := e.newSequence(ctx, req, emit, time.Now())
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

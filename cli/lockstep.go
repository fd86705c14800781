package cli

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/server"
)

// rankExchange shares rank 0's scheduling decisions with the other ranks of a split
// target (engine.Lockstep) through the group's own collectives: a two-word header (the
// payload's bytes, a check word) and then, when there is one, the payload, each summed
// over the ranks with zeros from every rank but 0 (exact in int32). An idle iteration
// costs one 8-byte all-sum.
type rankExchange struct {
	sh *model.Shard
}

// lockstepCheck marks a header as rank 0's: a header summed from ranks that disagree on
// who is rank 0 (or garbage) does not carry it.
const lockstepCheck = 0x44464c53 // "DFLS"

// Exchange implements engine.Lockstep. MLX thread.
func (x *rankExchange) Exchange(mine engine.Decisions) (engine.Decisions, error) {
	lead := x.sh.Rank == 0
	var payload []byte
	if lead && !mine.Empty() {
		var err error
		if payload, err = json.Marshal(mine); err != nil {
			return engine.Decisions{}, err
		}
	}
	var got engine.Decisions
	err := mlxc.Catch(func() {
		sc := mlxc.NewScope()
		defer sc.Close()
		head := []int32{0, 0}
		if lead {
			head = []int32{int32(len(payload)), lockstepCheck}
		}
		h := mlxc.AllSum(mlxc.FromSlice(head, 2), x.sh.Group).Int32s()
		if h[1] != lockstepCheck || h[0] < 0 {
			panic(&mlxc.Error{Op: "lockstep exchange", Msg: fmt.Sprintf("a malformed header %v from rank 0", h)})
		}
		n := int(h[0])
		if n == 0 {
			return
		}
		words := make([]int32, (n+3)/4)
		if lead {
			buf := make([]byte, 4*len(words))
			copy(buf, payload)
			for i := range words {
				words[i] = int32(binary.LittleEndian.Uint32(buf[4*i:]))
			}
		}
		sum := mlxc.AllSum(mlxc.FromSlice(words, len(words)), x.sh.Group).Int32s()
		buf := make([]byte, 4*len(sum))
		for i, w := range sum {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(w))
		}
		if err := json.Unmarshal(buf[:n], &got); err != nil {
			panic(&mlxc.Error{Op: "lockstep exchange", Msg: "rank 0's decisions: " + err.Error()})
		}
	})
	if err != nil {
		return engine.Decisions{}, err
	}
	return got, nil
}

// rankRequest is a generation as it travels from rank 0 to the other ranks of a split
// target: what the server gave, with the seed rank 0 chose, from which every rank makes
// the same engine.Request (backend.engineRequest).
type rankRequest struct {
	Prompt      []int32            `json:"prompt"`
	MaxTokens   int                `json:"max_tokens"`
	Temperature float64            `json:"temperature,omitempty"`
	TopP        float64            `json:"top_p,omitempty"`
	TopK        int                `json:"top_k,omitempty"`
	MinP        float64            `json:"min_p,omitempty"`
	Seed        uint64             `json:"seed"`
	Stop        []string           `json:"stop,omitempty"`
	Constraint  *server.Constraint `json:"constraint,omitempty"`
}

// follow runs a following rank of a split target's server: it builds what rank 0 admits
// and steps with it until rank 0 closes (nil) or a rank fails; no signal ends it (rank 0
// drains, then closes the schedule).
func (b *backend) follow(ex *rankExchange) error {
	return b.s.rankError(b.s.Engine.Follow(context.Background(), ex, func(wire []byte) (engine.Request, func(), error) {
		var rr rankRequest
		if err := json.Unmarshal(wire, &rr); err != nil {
			return engine.Request{}, nil, err
		}
		return b.engineRequest(rr)
	}))
}

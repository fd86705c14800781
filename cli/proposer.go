package cli

import (
	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// proposerFor is the proposer of a loaded drafter's generation: DFlash2 drafters draft
// through their candidate selector and a bounded context window, DFlash1 drafters as
// before.
func proposerFor(d *draft.Drafter) verify.Proposer {
	if d.Cfg.Kind == draft.DFlash2 {
		return verify.NewDFlash2(d)
	}
	return verify.NewDFlash(d)
}

// DraftKind is the loaded drafter's generation ("dflash", "dflash2"), "" without one.
func (s *Session) DraftKind() string {
	if s.drafter == nil {
		return ""
	}
	return s.drafter.Cfg.Kind.String()
}

package cli

import (
	"errors"
	"fmt"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
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

// The --draft-kind values.
const (
	draftAuto   = "auto"
	draftDFlash = "dflash"
	draftMTP    = "mtp"
	draftNone   = "none"
)

// checkDraftKind validates --draft-kind against the other drafter options ("" is auto)
// and folds --no-draft into it.
func checkDraftKind(cfg *LoadConfig) error {
	switch cfg.DraftKind {
	case "":
		cfg.DraftKind = draftAuto
	case draftAuto, draftDFlash, draftMTP, draftNone:
	default:
		return fmt.Errorf("--draft-kind %q: want auto, dflash, mtp or none", cfg.DraftKind)
	}
	switch {
	case cfg.NoDraft && cfg.DraftKind != draftAuto && cfg.DraftKind != draftNone:
		return fmt.Errorf("--no-draft and --draft-kind %s contradict each other", cfg.DraftKind)
	case cfg.Draft != "" && (cfg.DraftKind == draftMTP || cfg.DraftKind == draftNone):
		return fmt.Errorf("--draft-model is a DFlash drafter; --draft-kind %s does not use one", cfg.DraftKind)
	case cfg.DraftKind == draftMTP && cfg.DistBackend != "":
		return errors.New("--draft-kind mtp: not on a split target yet (--dist-backend); use dflash or none")
	}
	if cfg.DraftKind == draftNone {
		cfg.NoDraft = true
	}
	return nil
}

// mtpBlock is the MTP proposer's largest block: --block-size, else verify's default.
func mtpBlock(maxBlock int) int {
	if maxBlock >= 2 {
		return maxBlock
	}
	return verify.DefaultMTPBlock
}

// useMTP makes the target's multi-token-prediction head the session's proposer: required
// with --draft-kind mtp (an error says why there is none), taken when present with auto
// (else plain decoding, said once). MLX thread.
func (s *Session) useMTP(m model.Model, cfg LoadConfig) error {
	var head *qwen35.MTP
	var why error
	if q, ok := m.(*qwen35.Model); ok {
		head, why = q.RequireMTP()
	} else {
		why = fmt.Errorf("%w: the %s family has none", model.ErrNoMTP, m.Arch().Family)
	}
	if head == nil {
		if cfg.DraftKind == draftMTP {
			return fmt.Errorf("--draft-kind mtp: %s: %w", cfg.Target, why)
		}
		if !cfg.Quiet || cfg.Logger != nil {
			s.Notice(fmt.Sprintf("no DFlash draft known for %s and no multi-token-prediction head in it; using plain decoding (pass --draft-model to speed it up)", cfg.Target))
		}
		return nil
	}
	s.mtp = true
	s.Engine.Proposer = verify.NewMTP(head, mtpBlock(cfg.MaxBlock))
	if cfg.DraftKind == draftAuto && (!cfg.Quiet || cfg.Logger != nil) {
		s.Notice(fmt.Sprintf("no DFlash drafter known for %s; drafting with its multi-token-prediction head (--draft-kind none for plain decoding)", cfg.Target))
	}
	return nil
}

// DraftKind is what drafts: the loaded drafter's generation ("dflash", "dflash2"), "mtp"
// for the target's own head, "" for plain decoding.
func (s *Session) DraftKind() string {
	if s.mtp {
		return draftMTP
	}
	if s.drafter == nil {
		return ""
	}
	return s.drafter.Cfg.Kind.String()
}

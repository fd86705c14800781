package grammar

/*
#include <stdlib.h>
#include "llguidance.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// Matcher follows one sequence's committed tokens. Not safe for concurrent use.
//
// Errors are sticky: once a token is refused, or llguidance fails, the matcher is in its
// error state (Err says why, Stopped is true) and every later call but Err, Stopped,
// Accepting and Close fails with that error. Rollback does not leave the error state.
type Matcher struct {
	t        *Tokenizer
	m        *C.LlgMatcher // nil once closed
	llgWords int           // llguidance's mask length, ≥ t.words (more if the tokenizer has more tokens than the model)
	scratch  []uint32      // llguidance's mask when llgWords != t.words

	consumed int // tokens llguidance has consumed (end tokens are never given to it)
	ended    int // end tokens consumed after them: the sequence has ended if > 0
	err      error
	cleanup  runtime.Cleanup
}

type matcherHandle struct {
	m *C.LlgMatcher
	t *Tokenizer
}

var errClosed = errors.New("grammar: matcher is closed")

// newMatcher wraps cm, for which the caller holds a reference on t.
func newMatcher(t *Tokenizer, cm *C.LlgMatcher) *Matcher {
	m := &Matcher{t: t, m: cm}
	m.llgWords = int(C.llg_matcher_get_mask_byte_size(cm)) / 4
	if m.llgWords != t.words {
		m.scratch = make([]uint32, m.llgWords)
	}
	m.cleanup = runtime.AddCleanup(m, func(h matcherHandle) {
		C.llg_free_matcher(h.m)
		h.t.release()
	}, matcherHandle{cm, t})
	return m
}

// Close frees the matcher. Idempotent.
func (m *Matcher) Close() {
	if m.m == nil {
		return
	}
	m.cleanup.Stop()
	C.llg_free_matcher(m.m)
	m.m = nil
	m.t.release()
}

// llgMessage is llguidance's error message, without its placeholder for the parser state
// (which this package asks it to leave out).
func llgMessage(msg *C.char) string {
	s := strings.TrimSpace(C.GoString(msg))
	return strings.TrimSpace(strings.TrimSuffix(s, "<non-verbose/>"))
}

// llgError is llguidance's error for the matcher, or nil.
func (m *Matcher) llgError() error {
	if msg := C.llg_matcher_get_error(m.m); msg != nil {
		return fmt.Errorf("grammar: %s", llgMessage(msg))
	}
	return nil
}

// usable is nil if the matcher can take calls, else why not.
func (m *Matcher) usable() error {
	if m.m == nil {
		return errClosed
	}
	if m.err != nil {
		return m.err
	}
	if C.llg_matcher_is_error(m.m) {
		m.err = m.llgError()
		if m.err == nil {
			m.err = errors.New("grammar: llguidance matcher is in its error state")
		}
		return m.err
	}
	return nil
}

// fail puts the matcher in its error state with err and returns it.
func (m *Matcher) fail(err error) error {
	m.err = err
	return err
}

// failLLG is fail for a failed llguidance call: what was done, and llguidance's reason.
func (m *Matcher) failLLG(what string) error {
	reason := "unknown error"
	if msg := C.llg_matcher_get_error(m.m); msg != nil {
		reason = llgMessage(msg)
	}
	return m.fail(fmt.Errorf("grammar: %s: %s (the matcher is now in its error state)", what, reason))
}

// Err is the matcher's error state, nil if it is fine (a closed matcher reports that).
func (m *Matcher) Err() error {
	defer runtime.KeepAlive(m)
	return m.usable()
}

// Allowed reports whether token tok is allowed by mask (bit tok&31 of word tok>>5).
func Allowed(mask []uint32, tok int32) bool {
	return tok >= 0 && int(tok>>5) < len(mask) && mask[tok>>5]>>(uint32(tok)&31)&1 != 0
}

// MaskInto writes the tokens allowed now into dst (MaskWords words): bit v of word v>>5 is
// set iff token v is allowed. After the sequence ended, or once the grammar is complete,
// only the end tokens are set. Ids at or past the model's vocabulary are never set.
func (m *Matcher) MaskInto(dst []uint32) error {
	defer runtime.KeepAlive(m)
	if len(dst) != m.t.words {
		return fmt.Errorf("grammar: mask has %d words, want %d", len(dst), m.t.words)
	}
	if err := m.usable(); err != nil {
		return err
	}
	return m.maskInto(dst)
}

func (m *Matcher) maskInto(dst []uint32) error {
	if m.ended > 0 {
		clear(dst)
		for _, e := range m.t.eos {
			dst[e>>5] |= 1 << (uint32(e) & 31)
		}
		return nil
	}
	buf := dst
	if m.scratch != nil {
		buf = m.scratch
	}
	if C.llg_matcher_compute_mask_into(m.m, (*C.uint32_t)(unsafe.Pointer(&buf[0])), C.size_t(4*len(buf))) != 0 {
		return m.failLLG("computing the token mask")
	}
	if m.scratch != nil {
		clear(dst[copy(dst, buf):])
	}
	if tail := uint(m.t.vocabSize % 32); tail != 0 {
		dst[len(dst)-1] &= 1<<tail - 1
	}
	return nil
}

// accepting is Accepting for a usable matcher.
func (m *Matcher) accepting() bool {
	if m.ended > 0 || C.llg_matcher_is_stopped(m.m) {
		return true
	}
	return bool(C.llg_matcher_is_accepting(m.m))
}

// Accepting reports whether an end token is allowed now: the grammar may end here (or
// has ended). False in the error state.
func (m *Matcher) Accepting() bool {
	defer runtime.KeepAlive(m)
	if m.usable() != nil {
		return false
	}
	return m.accepting()
}

// Stopped reports whether only an end token is allowed now: the grammar is complete, or
// the sequence has ended; also true in the error state and once closed.
func (m *Matcher) Stopped() bool {
	defer runtime.KeepAlive(m)
	if m.usable() != nil {
		return true
	}
	return m.ended > 0 || bool(C.llg_matcher_is_stopped(m.m))
}

// endAllowed reports whether an end token is allowed now: where the grammar is accepting,
// and also where its mask allows one anyway (a lexeme llguidance ends at an end token).
func (m *Matcher) endAllowed(tok int32) (bool, error) {
	if m.accepting() {
		return true, nil
	}
	mask := make([]uint32, m.t.words)
	if err := m.maskInto(mask); err != nil {
		return false, err
	}
	return Allowed(mask, tok), nil
}

// Consume commits tokens in order. A token the grammar does not allow now (one MaskInto
// would not set) is an error, and leaves the matcher in its error state (the tokens before
// it stay consumed). An allowed end token ends the sequence: after it only end tokens are
// accepted (see the package comment).
func (m *Matcher) Consume(tokens ...int32) error {
	defer runtime.KeepAlive(m)
	if err := m.usable(); err != nil {
		return err
	}
	vocab := int32(m.t.vocabSize)
	for i := 0; i < len(tokens); {
		tok := tokens[i]
		switch {
		case tok < 0 || tok >= vocab:
			return m.fail(fmt.Errorf("grammar: token %d out of range (vocabulary size %d); the matcher is now in its error state", tok, vocab))
		case m.ended > 0:
			if !m.t.isEOS(tok) {
				return m.fail(fmt.Errorf("grammar: token %d after the end of the sequence; the matcher is now in its error state", tok))
			}
			m.ended++
			i++
			continue
		case m.t.isEOS(tok):
			ok, err := m.endAllowed(tok)
			if err != nil {
				return err
			}
			if !ok {
				return m.fail(fmt.Errorf("grammar: end token %d not allowed: the grammar is not complete; the matcher is now in its error state", tok))
			}
			m.ended++
			i++
			continue
		}
		j := i + 1
		for j < len(tokens) && tokens[j] >= 0 && tokens[j] < vocab && !m.t.isEOS(tokens[j]) {
			j++
		}
		run := tokens[i:j]
		if C.llg_matcher_consume_tokens(m.m, (*C.uint32_t)(unsafe.Pointer(&run[0])), C.size_t(len(run))) != 0 {
			what := fmt.Sprintf("token %d not allowed", run[0])
			if len(run) > 1 {
				what = fmt.Sprintf("tokens %v not allowed", run)
			}
			return m.failLLG(what)
		}
		m.consumed += len(run)
		i = j
	}
	return nil
}

// Consumed is the number of tokens consumed so far (net of rollbacks), end tokens included.
func (m *Matcher) Consumed() int { return m.consumed + m.ended }

// Rollback takes back the last n consumed tokens (end tokens included). n larger than
// Consumed is an error that leaves the matcher as it was.
func (m *Matcher) Rollback(n int) error {
	defer runtime.KeepAlive(m)
	if err := m.usable(); err != nil {
		return err
	}
	if n < 0 || n > m.consumed+m.ended {
		return fmt.Errorf("grammar: cannot roll back %d tokens: %d consumed", n, m.consumed+m.ended)
	}
	e := min(n, m.ended)
	m.ended -= e
	n -= e
	if n == 0 {
		return nil
	}
	if C.llg_matcher_rollback(m.m, C.size_t(n)) != 0 {
		return m.failLLG(fmt.Sprintf("rolling back %d tokens", n))
	}
	m.consumed -= n
	return nil
}

// validate is llguidance's count of how many of tokens (in range, none an end token except
// maybe the last) it would accept in order.
func (m *Matcher) validate(tokens []int32) int {
	r := C.llg_matcher_validate_tokens(m.m, (*C.uint32_t)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)))
	if r < 0 {
		_ = m.failLLG("validating tokens")
		return 0
	}
	return int(r)
}

// ValidPrefix is how many of tokens would be accepted in order, without advancing. An end
// token counts where the grammar is accepting (and end tokens after it count too).
// llguidance ignores a grammar's max_tokens limits here. 0 in the error state.
func (m *Matcher) ValidPrefix(tokens []int32) int {
	defer runtime.KeepAlive(m)
	if m.usable() != nil || len(tokens) == 0 {
		return 0
	}
	vocab := int32(m.t.vocabSize)
	n := 0
	if m.ended == 0 {
		j := 0
		for j < len(tokens) && tokens[j] >= 0 && tokens[j] < vocab && !m.t.isEOS(tokens[j]) {
			j++
		}
		if j > 0 {
			if r := m.validate(tokens[:j]); r < j {
				return r
			}
		}
		if j == len(tokens) || !m.t.isEOS(tokens[j]) {
			return j
		}
		if j == 0 {
			if !m.accepting() {
				return 0
			}
		} else if m.validate(tokens[:j+1]) < j+1 {
			return j
		}
		n = j + 1
	}
	for n < len(tokens) && m.t.isEOS(tokens[n]) {
		n++
	}
	return n
}

// Forced is the tokens the grammar forces next (llguidance's fast-forward tokens), empty
// when none is forced. See the package comment: with this package's tokenizer llguidance
// computes none.
func (m *Matcher) Forced() []int32 {
	defer runtime.KeepAlive(m)
	if m.usable() != nil || m.ended > 0 {
		return nil
	}
	buf := make([]uint32, 256)
	r := C.llg_matcher_compute_ff_tokens(m.m, (*C.uint32_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if r < 0 {
		_ = m.failLLG("computing forced tokens")
		return nil
	}
	out := make([]int32, 0, r)
	for _, t := range buf[:r] {
		if int(t) < m.t.vocabSize {
			out = append(out, int32(t))
		}
	}
	return out
}

// Clone returns an independent matcher in the same state (llguidance's deep clone).
func (m *Matcher) Clone() (*Matcher, error) {
	defer runtime.KeepAlive(m)
	if err := m.usable(); err != nil {
		return nil, err
	}
	m.t.retain() // m holds a reference, so the tokenizer is alive even if closed
	cm := C.llg_clone_matcher(m.m)
	if cm == nil {
		m.t.release()
		return nil, errors.New("grammar: llguidance could not clone the matcher")
	}
	c := newMatcher(m.t, cm)
	c.consumed, c.ended = m.consumed, m.ended
	return c, nil
}

// ChainMasks computes the masks of a speculative verify block: dst holds len(drafts)+1
// rows of MaskWords words; row 0 is the mask now, row j+1 the mask after consuming
// drafts[0..j]. The walk stops at the first draft its row does not allow, at index k:
// rows k+1.. are copies of row k (never used). It returns k (len(drafts) if all are
// allowed). The matcher is rolled back to where it was before returning, also on errors,
// except an error from llguidance itself, which leaves the matcher in its error state.
func (m *Matcher) ChainMasks(drafts []int32, dst []uint32) (int, error) {
	defer runtime.KeepAlive(m)
	w := m.t.words
	if len(dst) != (len(drafts)+1)*w {
		return 0, fmt.Errorf("grammar: chain masks buffer has %d words, want %d (%d rows of %d)",
			len(dst), (len(drafts)+1)*w, len(drafts)+1, w)
	}
	if err := m.usable(); err != nil {
		return 0, err
	}
	k := 0
	for ; ; k++ {
		row := dst[k*w : (k+1)*w]
		if err := m.maskInto(row); err != nil {
			return k, err
		}
		if k == len(drafts) || !Allowed(row, drafts[k]) {
			break
		}
		if err := m.Consume(drafts[k]); err != nil {
			return k, err
		}
	}
	for j := k + 1; j <= len(drafts); j++ {
		copy(dst[j*w:(j+1)*w], dst[k*w:(k+1)*w])
	}
	if err := m.Rollback(k); err != nil {
		return k, err
	}
	return k, nil
}

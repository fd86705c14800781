// Package grammar constrains decoding to a grammar: a JSON schema, any JSON object, a Lark
// grammar or a regular expression. It binds llguidance (the Rust library, through its C API
// and the static library that scripts/deps_llguidance.sh builds into
// third_party/llguidance).
//
// A Tokenizer is llguidance's view of a model's vocabulary, built once per model from its
// tokenizer.json. A Matcher follows one sequence: MaskInto gives the tokens allowed next (one
// bit per token), Consume commits tokens, Rollback takes them back, and ChainMasks computes
// the masks of a speculative verify block (one row per draft position) and leaves the
// matcher where it was.
//
// End tokens. The Tokenizer's end ids (eos) are allowed wherever the grammar may end
// (Accepting), and once the grammar is complete (Stopped) they are the only tokens allowed.
// Consuming an allowed end token ends the sequence: the matcher is then Stopped, its mask
// holds only the end ids, and further end tokens are accepted (a run of end tokens is fine,
// any other token is an error). End tokens are kept by this package, not passed to
// llguidance (which refuses every token once stopped), so a Rollback over them is exact.
//
// Forced tokens. llguidance computes forced tokens only for a tokenizer whose tokenize
// function is canonical; this package gives it none (it tokenizes greedily from the
// vocabulary), so Forced is empty, and masks allow every tokenization of the allowed text.
package grammar

/*
#cgo CFLAGS: -I${SRCDIR}/../third_party/llguidance
#cgo LDFLAGS: -L${SRCDIR}/../third_party/llguidance -lllguidance -lpthread -ldl -lm
#cgo noescape llg_matcher_compute_mask_into
#cgo nocallback llg_matcher_compute_mask_into
#cgo noescape llg_matcher_consume_tokens
#cgo nocallback llg_matcher_consume_tokens
#cgo noescape llg_matcher_validate_tokens
#cgo nocallback llg_matcher_validate_tokens
#cgo noescape llg_matcher_compute_ff_tokens
#cgo nocallback llg_matcher_compute_ff_tokens
#include <stdlib.h>
#include <string.h>
#include "llguidance.h"

// The init structs must be zero-initialised (fields added by later versions then default
// to zero), so they are filled here rather than in Go.
static LlgTokenizer *grammar_new_tokenizer(const char *tokenizer_json, uint32_t vocab_size,
		uint32_t eos, const uint32_t *eos_extra, uint32_t n_eos_extra, char *err, size_t err_len) {
	LlgTokenizerInitV2 init;
	memset(&init, 0, sizeof init);
	init.struct_size = sizeof init;
	init.vocab_size = vocab_size;
	init.tok_eos = eos;
	init.tokenizer_json = tokenizer_json;
	init.use_approximate_greedy_tokenize_fn = true;
	init.tok_eos_extra = n_eos_extra > 0 ? eos_extra : NULL;
	init.tok_eos_extra_count = n_eos_extra;
	return llg_new_tokenizer_v2(&init, err, err_len);
}

static void grammar_constraint_init(LlgConstraintInit *init, const LlgTokenizer *tok) {
	memset(init, 0, sizeof *init);
	llg_constraint_init_set_defaults(init, tok);
	init->log_buffer_level = 0;
	init->log_stderr_level = 0;
	init->limits.verbose_errors = false; // no parser state or grammar dumps in error messages
}

static int32_t grammar_validate(const LlgTokenizer *tok, const char *type, const char *data,
		char *msg, size_t msg_len) {
	LlgConstraintInit init;
	grammar_constraint_init(&init, tok);
	return llg_validate_grammar(&init, type, data, msg, msg_len);
}

static LlgMatcher *grammar_new_matcher(const LlgTokenizer *tok, const char *type, const char *data) {
	LlgConstraintInit init;
	grammar_constraint_init(&init, tok);
	return llg_new_matcher(&init, type, data);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Kind is the kind of a grammar's source.
type Kind string

const (
	JSONSchema Kind = "json_schema" // Source: a JSON Schema document
	JSONObject Kind = "json_object" // Source ignored: any JSON object
	Lark       Kind = "lark"        // Source: a Lark grammar as llguidance takes it (may use %json{...})
	Regex      Kind = "regex"       // Source: a regular expression (Rust regex syntax) the whole output matches
)

// Grammar is a constraint on a sequence's output.
type Grammar struct {
	Kind   Kind
	Source string
}

// llgType is the constraint type llguidance's C API takes for the kind, and the data.
func (g Grammar) llgType() (typ, data string, err error) {
	switch g.Kind {
	case JSONSchema, Lark, Regex:
		data = g.Source
	case JSONObject:
		data = ""
	default:
		return "", "", fmt.Errorf("grammar: unknown grammar kind %q (want %s, %s, %s or %s)",
			g.Kind, JSONSchema, JSONObject, Lark, Regex)
	}
	if strings.IndexByte(data, 0) >= 0 {
		return "", "", fmt.Errorf("grammar: %s grammar contains a NUL byte", g.Kind)
	}
	return string(g.Kind), data, nil
}

const errBufLen = 4096

// Tokenizer is llguidance's view of a model's vocabulary. Safe for concurrent use.
//
// Close frees it once every Matcher made from it is closed too (a Matcher keeps its
// Tokenizer's llguidance state alive).
type Tokenizer struct {
	vocabSize int
	words     int
	eos       []int32

	mu      sync.Mutex
	tok     *C.LlgTokenizer // nil once freed
	refs    int             // open matchers and calls in flight
	closed  bool
	cleanup runtime.Cleanup
}

// NewTokenizer builds llguidance's tokenizer from a Hugging Face tokenizer.json (byte-level
// BPE or byte-fallback vocabularies). vocabSize is the model's vocabulary (the rows of its
// LM head), which may exceed the tokenizer's: ids past the tokenizer's are never allowed.
// eos lists every end id (the first is llguidance's tok_eos, the rest its extra end ids);
// each must be below vocabSize, and there must be at least one.
func NewTokenizer(tokenizerJSON []byte, vocabSize int, eos []int32) (*Tokenizer, error) {
	if vocabSize <= 0 || vocabSize > 1<<31-1 {
		return nil, fmt.Errorf("grammar: vocabulary size %d out of range", vocabSize)
	}
	if len(eos) == 0 {
		return nil, errors.New("grammar: no end token ids")
	}
	for _, id := range eos {
		if id < 0 || int(id) >= vocabSize {
			return nil, fmt.Errorf("grammar: end token id %d out of range (vocabulary size %d)", id, vocabSize)
		}
	}
	if len(tokenizerJSON) == 0 {
		return nil, errors.New("grammar: empty tokenizer.json")
	}
	if strings.IndexByte(string(tokenizerJSON), 0) >= 0 {
		return nil, errors.New("grammar: tokenizer.json contains a NUL byte")
	}
	cjson := C.CString(string(tokenizerJSON))
	defer C.free(unsafe.Pointer(cjson))
	errBuf := (*C.char)(C.calloc(errBufLen, 1))
	defer C.free(unsafe.Pointer(errBuf))
	var extra *C.uint32_t
	if len(eos) > 1 {
		extra = (*C.uint32_t)(C.malloc(C.size_t(4 * (len(eos) - 1))))
		defer C.free(unsafe.Pointer(extra))
		xs := unsafe.Slice(extra, len(eos)-1)
		for i, id := range eos[1:] {
			xs[i] = C.uint32_t(id)
		}
	}
	tok := C.grammar_new_tokenizer(cjson, C.uint32_t(vocabSize), C.uint32_t(eos[0]), extra,
		C.uint32_t(len(eos)-1), errBuf, errBufLen)
	if tok == nil {
		return nil, fmt.Errorf("grammar: llguidance tokenizer: %s", C.GoString(errBuf))
	}
	t := &Tokenizer{
		vocabSize: vocabSize,
		words:     (vocabSize + 31) / 32,
		eos:       append([]int32(nil), eos...),
		tok:       tok,
	}
	t.cleanup = runtime.AddCleanup(t, func(tok *C.LlgTokenizer) { C.llg_free_tokenizer(tok) }, tok)
	return t, nil
}

// VocabSize is the model's vocabulary size given to NewTokenizer.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// MaskWords is the length of a mask in 32-bit words: ⌈VocabSize/32⌉.
func (t *Tokenizer) MaskWords() int { return t.words }

// EOS returns the end token ids (a copy).
func (t *Tokenizer) EOS() []int32 { return append([]int32(nil), t.eos...) }

func (t *Tokenizer) isEOS(tok int32) bool {
	for _, e := range t.eos {
		if e == tok {
			return true
		}
	}
	return false
}

// acquire takes a reference on the llguidance tokenizer, which stays valid until release.
func (t *Tokenizer) acquire() (*C.LlgTokenizer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errors.New("grammar: tokenizer is closed")
	}
	t.refs++
	return t.tok, nil
}

// retain takes one more reference for a holder of one.
func (t *Tokenizer) retain() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refs++
}

func (t *Tokenizer) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refs--
	t.freeLocked()
}

func (t *Tokenizer) freeLocked() {
	if t.closed && t.refs == 0 && t.tok != nil {
		t.cleanup.Stop()
		C.llg_free_tokenizer(t.tok)
		t.tok = nil
	}
}

// Close frees the tokenizer (at once, or when the last of its matchers is closed).
// Idempotent; NewMatcher and Validate fail after it.
func (t *Tokenizer) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.freeLocked()
}

// Validate checks a grammar without building a matcher (llguidance's llg_validate_grammar,
// about twice as fast). A warning is not an error.
func (t *Tokenizer) Validate(g Grammar) error {
	typ, data, err := g.llgType()
	if err != nil {
		return err
	}
	tok, err := t.acquire()
	if err != nil {
		return err
	}
	defer t.release()
	ctyp, cdata := C.CString(typ), C.CString(data)
	defer C.free(unsafe.Pointer(ctyp))
	defer C.free(unsafe.Pointer(cdata))
	msg := (*C.char)(C.calloc(errBufLen, 1))
	defer C.free(unsafe.Pointer(msg))
	if rc := C.grammar_validate(tok, ctyp, cdata, msg, errBufLen); rc < 0 {
		return fmt.Errorf("grammar: invalid %s grammar: %s", g.Kind, C.GoString(msg))
	}
	return nil
}

// NewMatcher starts a matcher for g at the beginning of a sequence. An invalid grammar is
// an error with llguidance's message.
func (t *Tokenizer) NewMatcher(g Grammar) (*Matcher, error) {
	typ, data, err := g.llgType()
	if err != nil {
		return nil, err
	}
	tok, err := t.acquire()
	if err != nil {
		return nil, err
	}
	ctyp, cdata := C.CString(typ), C.CString(data)
	defer C.free(unsafe.Pointer(ctyp))
	defer C.free(unsafe.Pointer(cdata))
	cm := C.grammar_new_matcher(tok, ctyp, cdata)
	if cm == nil { // llguidance documents a non-null result; be safe anyway
		t.release()
		return nil, fmt.Errorf("grammar: llguidance returned no matcher for the %s grammar", g.Kind)
	}
	if msg := C.llg_matcher_get_error(cm); msg != nil {
		err := fmt.Errorf("grammar: invalid %s grammar: %s", g.Kind, C.GoString(msg))
		C.llg_free_matcher(cm)
		t.release()
		return nil, err
	}
	return newMatcher(t, cm), nil
}

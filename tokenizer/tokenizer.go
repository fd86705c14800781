package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	hftokenizers "github.com/daulet/tokenizers"
)

// Tokenizer encodes and decodes text for one model directory and renders its
// chat template. It is safe for concurrent use until Close.
type Tokenizer struct {
	dir       string
	lib       *hftokenizers.Tokenizer
	closeOnce sync.Once

	vocab      *vocabulary
	byteLevel  bool     // decoder is ByteLevel: decode in Go from tokenBytes
	tokenBytes [][]byte // per id, the bytes the ByteLevel decoder gives it
	vocabSize  int

	named     map[string]string // bos_token, eos_token, ... -> content
	templates map[string]string // chat templates by name
	eosIDs    []int32

	templateMu sync.Mutex
	parsed     map[string]*ChatTemplate
}

// Load reads a tokenizer from a model directory: tokenizer.json (required),
// tokenizer_config.json, special_tokens_map.json, chat_template.jinja,
// additional_chat_templates/, config.json and generation_config.json (all
// optional). A file that exists but cannot be parsed is an error naming it.
func Load(dir string) (*Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	tf, vocab, err := parseTokenizerFile(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	decType, err := decoderType(tf.Decoder)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	cfg, err := loadTokenizerConfig(dir)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	eosIDs, err := resolveEOSIDs(dir, cfg.named["eos_token"], vocab)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	lib, err := hftokenizers.FromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	t := &Tokenizer{
		dir:       dir,
		lib:       lib,
		vocab:     vocab,
		byteLevel: decType == "ByteLevel",
		vocabSize: int(lib.VocabSize()),
		named:     cfg.named,
		templates: cfg.templates,
		eosIDs:    eosIDs,
	}
	if t.byteLevel {
		t.tokenBytes = make([][]byte, len(vocab.idToToken))
		for id, tok := range vocab.idToToken {
			if vocab.hasID[id] {
				t.tokenBytes[id] = byteLevelTokenBytes(tok)
			}
		}
	}
	return t, nil
}

// Close frees the native tokenizer. The Tokenizer must not be used after.
func (t *Tokenizer) Close() error {
	t.closeOnce.Do(func() { t.lib.Close() })
	return nil
}

// Dir returns the model directory the tokenizer was loaded from.
func (t *Tokenizer) Dir() string { return t.dir }

// VocabSize returns the number of tokens including added tokens, as the
// Python tokenizers' get_vocab_size(with_added_tokens=True). A model's
// embedding table may be larger (padding rows); ids past the vocabulary
// decode to nothing.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// Encode turns text into token ids. Special tokens written in the text (such
// as "<|im_start|>") are recognised as their ids. addSpecialTokens applies
// the tokenizer's post-processor (e.g. a BOS token); Qwen adds none.
// Invalid UTF-8 is replaced by U+FFFD per maximal subpart before encoding.
// Text containing a NUL byte is rejected: the native API takes C strings and
// would silently drop everything after it.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]int32, error) {
	if i := strings.IndexByte(text, 0); i >= 0 {
		return nil, fmt.Errorf("encode: text contains a NUL byte at offset %d", i)
	}
	enc := t.lib.EncodeWithOptions(text, addSpecialTokens)
	ids := make([]int32, len(enc.IDs))
	for i, id := range enc.IDs {
		ids[i] = int32(id)
	}
	return ids, nil
}

// Decode turns ids into text, as the Python tokenizers' decode: ids that are
// not in the vocabulary are skipped, special tokens are dropped when
// skipSpecialTokens is set, and bytes that are not valid UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int32, skipSpecialTokens bool) string {
	if t.byteLevel {
		var buf []byte
		for _, id := range ids {
			buf = t.appendTokenBytes(buf, id, skipSpecialTokens)
		}
		return lossyUTF8(buf)
	}
	return t.libDecode(ids, skipSpecialTokens)
}

// appendTokenBytes appends the ByteLevel bytes of one id to buf.
func (t *Tokenizer) appendTokenBytes(buf []byte, id int32, skipSpecialTokens bool) []byte {
	tok, ok := t.vocab.token(id)
	if !ok || (skipSpecialTokens && t.vocab.special[tok]) {
		return buf
	}
	return append(buf, t.tokenBytes[id]...)
}

// libDecode decodes through the native library. It is used for decoders
// other than ByteLevel; the C API cannot return text with a NUL byte, which
// then comes back empty.
func (t *Tokenizer) libDecode(ids []int32, skipSpecialTokens bool) string {
	u := make([]uint32, 0, len(ids))
	for _, id := range ids {
		if id >= 0 {
			u = append(u, uint32(id))
		}
	}
	return t.lib.Decode(u, skipSpecialTokens)
}

// TokenID returns the id of a token string (added tokens first, then the
// model vocabulary, as spelled in tokenizer.json).
func (t *Tokenizer) TokenID(token string) (int32, bool) {
	id, ok := t.vocab.tokenToID[token]
	return id, ok
}

// Token returns the token string of an id, as spelled in tokenizer.json.
func (t *Tokenizer) Token(id int32) (string, bool) {
	return t.vocab.token(id)
}

// AddedToken is one of tokenizer.json's added tokens.
type AddedToken struct {
	ID      int32
	Content string
	Special bool // dropped by Decode when skipping special tokens
}

// AddedTokens returns the added tokens in tokenizer.json order.
func (t *Tokenizer) AddedTokens() []AddedToken {
	out := make([]AddedToken, len(t.vocab.added))
	for i, a := range t.vocab.added {
		out[i] = AddedToken{ID: a.ID, Content: a.Content, Special: a.Special}
	}
	return out
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id int32) bool {
	tok, ok := t.vocab.token(id)
	return ok && t.vocab.special[tok]
}

// NamedToken returns the content of a named special token from
// tokenizer_config.json ("bos_token", "eos_token", "pad_token", "unk_token",
// ...), and whether it is set.
func (t *Tokenizer) NamedToken(name string) (string, bool) {
	s, ok := t.named[name]
	return s, ok
}

// EOSTokenIDs returns the ids that end generation; see resolveEOSIDs for the
// sources. The slice is a copy.
func (t *Tokenizer) EOSTokenIDs() []int32 {
	return append([]int32(nil), t.eosIDs...)
}

// IsEOS reports whether id ends generation.
func (t *Tokenizer) IsEOS(id int32) bool {
	for _, e := range t.eosIDs {
		if e == id {
			return true
		}
	}
	return false
}

// HasThinking reports whether the vocabulary has both <think> and </think>,
// the sign (as in mlx-lm) that the model supports a reasoning section and
// that enable_thinking defaults to true.
func (t *Tokenizer) HasThinking() bool {
	_, open := t.vocab.tokenToID["<think>"]
	_, close := t.vocab.tokenToID["</think>"]
	return open && close
}

package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// tokenizerFile holds the parts of tokenizer.json that this package reads
// itself; the Rust library reads the whole file for encoding.
type tokenizerFile struct {
	AddedTokens []addedToken    `json:"added_tokens"`
	Decoder     json.RawMessage `json:"decoder"`
	Model       struct {
		Type  string          `json:"type"`
		Vocab json.RawMessage `json:"vocab"`
	} `json:"model"`
}

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID      int32  `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

// vocabulary is the id <-> token mapping of a tokenizer: the model's vocab
// plus the added tokens, which take precedence on a shared id as they do in
// the Rust library.
type vocabulary struct {
	idToToken []string // "" where an id has no token
	hasID     []bool
	tokenToID map[string]int32
	special   map[string]bool // contents of special added tokens
	added     []addedToken
}

// parseTokenizerFile reads what the package needs from tokenizer.json bytes.
func parseTokenizerFile(data []byte) (*tokenizerFile, *vocabulary, error) {
	var tf tokenizerFile
	if err := json.Unmarshal(data, &tf); err != nil {
		return nil, nil, fmt.Errorf("parse JSON: %w", err)
	}
	vocab, err := buildVocabulary(&tf)
	if err != nil {
		return nil, nil, err
	}
	return &tf, vocab, nil
}

func buildVocabulary(tf *tokenizerFile) (*vocabulary, error) {
	v := &vocabulary{
		tokenToID: make(map[string]int32),
		special:   make(map[string]bool),
		added:     tf.AddedTokens,
	}
	set := func(id int32, token string) error {
		if id < 0 {
			return fmt.Errorf("token %q has negative id %d", token, id)
		}
		for int(id) >= len(v.idToToken) {
			v.idToToken = append(v.idToToken, "")
			v.hasID = append(v.hasID, false)
		}
		v.idToToken[id] = token
		v.hasID[id] = true
		v.tokenToID[token] = id
		return nil
	}
	raw := bytes.TrimSpace(tf.Model.Vocab)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		return nil, fmt.Errorf("model.vocab is missing")
	case raw[0] == '{': // BPE, WordPiece, WordLevel: {"token": id}
		var m map[string]int32
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("model.vocab: %w", err)
		}
		for token, id := range m {
			if err := set(id, token); err != nil {
				return nil, fmt.Errorf("model.vocab: %w", err)
			}
		}
	case raw[0] == '[': // Unigram: [["piece", score], ...], id = position
		var pieces [][2]json.RawMessage
		if err := json.Unmarshal(raw, &pieces); err != nil {
			return nil, fmt.Errorf("model.vocab: %w", err)
		}
		for i, p := range pieces {
			var token string
			if err := json.Unmarshal(p[0], &token); err != nil {
				return nil, fmt.Errorf("model.vocab[%d]: %w", i, err)
			}
			if err := set(int32(i), token); err != nil {
				return nil, fmt.Errorf("model.vocab: %w", err)
			}
		}
	default:
		return nil, fmt.Errorf("model.vocab is neither an object nor a list")
	}
	for _, at := range tf.AddedTokens {
		if err := set(at.ID, at.Content); err != nil {
			return nil, fmt.Errorf("added_tokens: %w", err)
		}
		if at.Special {
			v.special[at.Content] = true
		}
	}
	return v, nil
}

// token returns the token string of id, and whether the id exists.
func (v *vocabulary) token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(v.idToToken) || !v.hasID[id] {
		return "", false
	}
	return v.idToToken[id], true
}

// decoderType returns the "type" of tokenizer.json's decoder, or "" if none.
func decoderType(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var d struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return "", fmt.Errorf("decoder: %w", err)
	}
	return d.Type, nil
}

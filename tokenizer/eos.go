package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
)

// resolveEOSIDs gathers every id that ends generation: eos_token_id from
// config.json and generation_config.json (an int or a list of ints; only the
// top-level key, never text_config's), plus the id of tokenizer_config's
// eos_token. Their union is returned in first-seen order. Missing files are
// fine; a malformed one is an error naming it.
func resolveEOSIDs(dir string, eosToken string, vocab *vocabulary) ([]int32, error) {
	var ids []int32
	seen := map[int32]bool{}
	add := func(id int32) {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, name := range []string{"config.json", "generation_config.json"} {
		path := filepath.Join(dir, name)
		var raw map[string]json.RawMessage
		err := readJSONFile(path, &raw)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		fileIDs, err := parseEOSField(raw["eos_token_id"])
		if err != nil {
			return nil, fmt.Errorf("parse %s: eos_token_id: %w", path, err)
		}
		for _, id := range fileIDs {
			add(id)
		}
	}
	if eosToken != "" {
		id, ok := vocab.tokenToID[eosToken]
		if !ok {
			return nil, fmt.Errorf("tokenizer_config.json in %s: eos_token %q is not in the vocabulary", dir, eosToken)
		}
		add(id)
	}
	return ids, nil
}

// parseEOSField reads an eos_token_id value: absent, null, an int or a list
// of ints.
func parseEOSField(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	switch v.(type) {
	case nil:
		return nil, nil
	case float64:
		id, err := tokenIDFromJSON(raw)
		if err != nil {
			return nil, err
		}
		return []int32{id}, nil
	case []any:
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, err
		}
		ids := make([]int32, 0, len(list))
		for i, item := range list {
			id, err := tokenIDFromJSON(item)
			if err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			ids = append(ids, id)
		}
		return ids, nil
	default:
		return nil, fmt.Errorf("want an int or a list of ints, got %s", string(raw))
	}
}

// tokenIDFromJSON parses a JSON integer that must fit a non-negative int32.
func tokenIDFromJSON(raw json.RawMessage) (int32, error) {
	n, err := strconv.ParseInt(string(raw), 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want a non-negative integer token id, got %s", string(raw))
	}
	return int32(n), nil
}

package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"strconv"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Template values follow Python's json.loads: objects keep their key order
// (Python dicts are ordered, and tojson prints them in that order), integers
// stay integers and other numbers are floats. Objects become *exec.Dict, the
// engine's ordered dict; arrays become []any.

// jsonToTemplateValue decodes one JSON document into a template value.
func jsonToTemplateValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeTemplateValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the JSON value")
	}
	return v, nil
}

func decodeTemplateValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		switch tok {
		case '{':
			dict := exec.NewDict()
			for dec.More() {
				keyTok, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key, _ := keyTok.(string)
				val, err := decodeTemplateValue(dec)
				if err != nil {
					return nil, err
				}
				setDictItem(dict, key, val)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			if len(dict.Pairs) == 0 {
				// The engine treats every ordered dict as true; an empty
				// map is false, as an empty Python dict, and has no order
				// to keep.
				return map[string]any{}, nil
			}
			return dict, nil
		case '[':
			list := []any{}
			for dec.More() {
				val, err := decodeTemplateValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, val)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return list, nil
		}
		return nil, fmt.Errorf("unexpected delimiter %v", tok)
	case json.Number:
		return jsonNumberValue(tok)
	default: // string, bool, nil
		return tok, nil
	}
}

// jsonNumberValue converts a JSON number as Python does: digits without a
// fraction or exponent are an int, everything else a float.
func jsonNumberValue(n json.Number) (any, error) {
	s := n.String()
	if bytes.ContainsAny([]byte(s), ".eE") {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", s, err)
		}
		return f, nil
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return int(i), nil
	}
	// Python ints are unbounded; keep the exact digits for tojson.
	b, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, fmt.Errorf("number %s is not an integer", s)
	}
	return b, nil
}

// setDictItem sets key in an ordered dict, keeping the position of an
// existing key as Python dicts do.
func setDictItem(d *exec.Dict, key string, val any) {
	v, ok := val.(*exec.Value)
	if !ok {
		v = exec.AsValue(val)
	}
	for _, p := range d.Pairs {
		if p.Key.IsString() && p.Key.String() == key {
			p.Value = v
			return
		}
	}
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: v})
}

// dictItem returns the value of key in an ordered dict.
func dictItem(d *exec.Dict, key string) (*exec.Value, bool) {
	for _, p := range d.Pairs {
		if p.Key.IsString() && p.Key.String() == key {
			return p.Value, true
		}
	}
	return nil, false
}

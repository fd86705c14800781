package structured

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// value is a JSON value that keeps its objects' key order. Schemas need it: llguidance
// generates an object's properties in the order the schema lists them, and the qwen3_coder
// tool format writes parameters in that order too, so a schema rewritten here must come out
// in its original order (encoding/json's maps would sort the keys).
type value struct {
	kind  kind
	keys  []string // object: keys in order
	vals  []*value // object: values by key index; array: elements
	str   string   // string
	num   string   // number: its text as written
	truth bool     // boolean
}

type kind uint8

const (
	kNull kind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
)

// parseJSON reads exactly one JSON value from data.
func parseJSON(data []byte) (*value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("text after the JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (*value, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, errors.New("no JSON value")
		}
		return nil, err
	}
	switch t := tok.(type) {
	case nil:
		return &value{kind: kNull}, nil
	case bool:
		return &value{kind: kBool, truth: t}, nil
	case json.Number:
		return &value{kind: kNumber, num: string(t)}, nil
	case string:
		return &value{kind: kString, str: t}, nil
	case json.Delim:
		switch t {
		case '[':
			v := &value{kind: kArray}
			for dec.More() {
				e, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				v.vals = append(v.vals, e)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return v, nil
		case '{':
			v := &value{kind: kObject}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key %v is not a string", kt)
				}
				e, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				v.set(key, e) // a repeated key keeps its last value, as serde_json does
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return v, nil
		}
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok)
}

// get is an object's member, nil if absent (or v is not an object).
func (v *value) get(key string) *value {
	if v == nil || v.kind != kObject {
		return nil
	}
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

// set replaces an object's member in place or appends it.
func (v *value) set(key string, e *value) {
	for i, k := range v.keys {
		if k == key {
			v.vals[i] = e
			return
		}
	}
	v.keys = append(v.keys, key)
	v.vals = append(v.vals, e)
}

// del removes an object's member.
func (v *value) del(key string) {
	for i, k := range v.keys {
		if k == key {
			v.keys = append(v.keys[:i:i], v.keys[i+1:]...)
			v.vals = append(v.vals[:i:i], v.vals[i+1:]...)
			return
		}
	}
}

func (v *value) isObject() bool { return v != nil && v.kind == kObject }

// clone is a deep copy.
func (v *value) clone() *value {
	if v == nil {
		return nil
	}
	c := *v
	c.keys = append([]string(nil), v.keys...)
	c.vals = make([]*value, len(v.vals))
	for i, e := range v.vals {
		c.vals[i] = e.clone()
	}
	return &c
}

func strValue(s string) *value { return &value{kind: kString, str: s} }

func objValue(kv ...any) *value {
	v := &value{kind: kObject}
	for i := 0; i+1 < len(kv); i += 2 {
		v.set(kv[i].(string), kv[i+1].(*value))
	}
	return v
}

func arrValue(elems ...*value) *value { return &value{kind: kArray, vals: elems} }

// encode writes v as compact JSON.
func (v *value) encode() string {
	var b bytes.Buffer
	v.write(&b)
	return b.String()
}

func (v *value) write(b *bytes.Buffer) {
	switch v.kind {
	case kNull:
		b.WriteString("null")
	case kBool:
		b.WriteString(strconv.FormatBool(v.truth))
	case kNumber:
		b.WriteString(v.num)
	case kString:
		b.WriteString(quoteJSON(v.str))
	case kArray:
		b.WriteByte('[')
		for i, e := range v.vals {
			if i > 0 {
				b.WriteByte(',')
			}
			e.write(b)
		}
		b.WriteByte(']')
	case kObject:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(quoteJSON(k))
			b.WriteByte(':')
			v.vals[i].write(b)
		}
		b.WriteByte('}')
	}
}

// quoteJSON is s as a JSON string literal. Unlike encoding/json it leaves <, > and & alone
// (they are ordinary characters in a grammar), and it escapes DEL, which llguidance's Lark
// string literals refuse raw.
func quoteJSON(s string) string {
	var b bytes.Buffer
	b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c < 0x20 || c == 0x7f:
				fmt.Fprintf(&b, `\u%04x`, c)
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString(`\ufffd`)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}

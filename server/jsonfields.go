package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// The request decoders read JSON by hand, field by field, instead of unmarshalling into
// structs, so that every mistake becomes a 400 naming the exact field
// ("messages[2].content[0].text") and saying what was expected and what came. A JSON null is
// treated as an absent field everywhere, as OpenAI does.

// jsonObject is one decoded JSON object with the path it was found at.
type jsonObject struct {
	path   string // "" for the request body
	fields map[string]json.RawMessage
}

// parseObject decodes raw as a JSON object; path names it in errors.
func parseObject(path string, raw json.RawMessage) (jsonObject, error) {
	if kind := jsonKind(raw); kind != "object" {
		if path == "" {
			return jsonObject{}, badRequest("invalid_json", "the request body must be a JSON object, got %s", kind)
		}
		return jsonObject{}, invalidField(path, "%s must be an object, got %s", path, kind)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return jsonObject{}, invalidField(path, "%s is not valid JSON: %v", displayPath(path), err)
	}
	return jsonObject{path: path, fields: fields}, nil
}

func displayPath(path string) string {
	if path == "" {
		return "the request body"
	}
	return path
}

// jsonKind names the JSON type of raw by its first byte.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

// child names a field of o.
func (o jsonObject) child(name string) string {
	if o.path == "" {
		return name
	}
	return o.path + "." + name
}

// lookup returns the raw value of a present, non-null field.
func (o jsonObject) lookup(name string) (json.RawMessage, bool) {
	raw, ok := o.fields[name]
	if !ok || jsonKind(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func (o jsonObject) has(name string) bool {
	_, ok := o.lookup(name)
	return ok
}

func (o jsonObject) string(name string) (string, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return "", false, nil
	}
	s, err := decodeString(o.child(name), raw)
	return s, err == nil, err
}

func decodeString(path string, raw json.RawMessage) (string, error) {
	if kind := jsonKind(raw); kind != "string" {
		return "", invalidField(path, "%s must be a string, got %s", path, kind)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", invalidField(path, "%s is not a valid JSON string: %v", path, err)
	}
	return s, nil
}

func (o jsonObject) boolean(name string) (bool, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return false, false, nil
	}
	if kind := jsonKind(raw); kind != "boolean" {
		return false, false, invalidField(o.child(name), "%s must be a boolean, got %s", o.child(name), kind)
	}
	return string(bytes.TrimSpace(raw)) == "true", true, nil
}

// number reads a JSON number as float64.
func (o jsonObject) number(name string) (float64, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return 0, false, nil
	}
	path := o.child(name)
	if kind := jsonKind(raw); kind != "number" {
		return 0, false, invalidField(path, "%s must be a number, got %s", path, kind)
	}
	v, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false, invalidField(path, "%s is out of range: %s", path, bytes.TrimSpace(raw))
	}
	return v, true, nil
}

// integer reads a JSON number that has no fractional part (100 and 1e2 both pass).
func (o jsonObject) integer(name string) (int64, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return 0, false, nil
	}
	path := o.child(name)
	if kind := jsonKind(raw); kind != "number" {
		return 0, false, invalidField(path, "%s must be an integer, got %s", path, kind)
	}
	text := string(bytes.TrimSpace(raw))
	if v, err := strconv.ParseInt(text, 10, 64); err == nil {
		return v, true, nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false, invalidField(path, "%s must be an integer, got %s", path, text)
	}
	return int64(f), true, nil
}

func (o jsonObject) object(name string) (jsonObject, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return jsonObject{}, false, nil
	}
	obj, err := parseObject(o.child(name), raw)
	return obj, err == nil, err
}

func (o jsonObject) array(name string) ([]json.RawMessage, bool, error) {
	raw, ok := o.lookup(name)
	if !ok {
		return nil, false, nil
	}
	items, err := decodeArray(o.child(name), raw)
	return items, err == nil, err
}

func decodeArray(path string, raw json.RawMessage) ([]json.RawMessage, error) {
	if kind := jsonKind(raw); kind != "array" {
		return nil, invalidField(path, "%s must be an array, got %s", path, kind)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalidField(path, "%s is not a valid JSON array: %v", path, err)
	}
	return items, nil
}

// index names element i of the array at path.
func index(path string, i int) string {
	return fmt.Sprintf("%s[%d]", path, i)
}

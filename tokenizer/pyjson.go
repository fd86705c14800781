package tokenizer

import (
	"fmt"
	"math"
	"math/big"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// pyJSONOptions are the json.dumps arguments transformers' tojson filter
// accepts.
type pyJSONOptions struct {
	ensureASCII bool
	indent      *string // nil: single line
	itemSep     string
	keySep      string
	sortKeys    bool
}

// defaultPyJSONOptions is json.dumps with transformers' tojson defaults:
// ensure_ascii=False, no indent, separators (", ", ": ").
func defaultPyJSONOptions() pyJSONOptions {
	return pyJSONOptions{itemSep: ", ", keySep: ": "}
}

// pyJSONDumps renders a template value exactly as Python's json.dumps.
func pyJSONDumps(v any, opts pyJSONOptions) (string, error) {
	var sb strings.Builder
	if err := writePyJSON(&sb, v, opts, 0); err != nil {
		return "", err
	}
	return sb.String(), nil
}

func writePyJSON(sb *strings.Builder, v any, opts pyJSONOptions, depth int) error {
	if val, ok := v.(*exec.Value); ok {
		if val == nil || val.IsNil() {
			sb.WriteString("null")
			return nil
		}
		v = val.Interface()
	}
	switch x := v.(type) {
	case nil:
		sb.WriteString("null")
	case bool:
		if x {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case string:
		writePyJSONString(sb, x, opts.ensureASCII)
	case int:
		sb.WriteString(strconv.Itoa(x))
	case int64:
		sb.WriteString(strconv.FormatInt(x, 10))
	case *big.Int:
		sb.WriteString(x.String())
	case float64:
		sb.WriteString(pyFloatRepr(x, true))
	case *exec.Dict:
		return writePyJSONDict(sb, x.Pairs, opts, depth)
	case exec.Dict:
		return writePyJSONDict(sb, x.Pairs, opts, depth)
	case []any:
		return writePyJSONList(sb, len(x), func(i int) any { return x[i] }, opts, depth)
	default:
		return writePyJSONReflect(sb, v, opts, depth)
	}
	return nil
}

// writePyJSONReflect handles the remaining Go shapes the engine produces
// (typed slices, maps from dict(), other ints and floats).
func writePyJSONReflect(sb *strings.Builder, v any, opts pyJSONOptions, depth int) error {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		sb.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		sb.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Float32:
		sb.WriteString(pyFloatRepr(rv.Float(), true))
	case reflect.String:
		writePyJSONString(sb, rv.String(), opts.ensureASCII)
	case reflect.Slice, reflect.Array:
		return writePyJSONList(sb, rv.Len(), func(i int) any { return rv.Index(i).Interface() }, opts, depth)
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return fmt.Errorf("tojson: keys must be strings, got %s", rv.Type().Key())
		}
		keys := make([]string, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			keys = append(keys, k.String())
		}
		// Go maps have no order; sorting keeps the output deterministic.
		sort.Strings(keys)
		pairs := make([]*exec.Pair, len(keys))
		for i, k := range keys {
			pairs[i] = &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(rv.MapIndex(reflect.ValueOf(k)).Interface())}
		}
		return writePyJSONDict(sb, pairs, opts, depth)
	case reflect.Pointer:
		if rv.IsNil() {
			sb.WriteString("null")
			return nil
		}
		return writePyJSON(sb, rv.Elem().Interface(), opts, depth)
	default:
		return fmt.Errorf("tojson: object of type %T is not JSON serializable", v)
	}
	return nil
}

func writePyJSONList(sb *strings.Builder, n int, at func(int) any, opts pyJSONOptions, depth int) error {
	if n == 0 {
		sb.WriteString("[]")
		return nil
	}
	sb.WriteByte('[')
	for i := 0; i < n; i++ {
		writePyJSONSeparator(sb, i, opts, depth+1)
		if err := writePyJSON(sb, at(i), opts, depth+1); err != nil {
			return err
		}
	}
	writePyJSONClose(sb, opts, depth)
	sb.WriteByte(']')
	return nil
}

func writePyJSONDict(sb *strings.Builder, pairs []*exec.Pair, opts pyJSONOptions, depth int) error {
	if len(pairs) == 0 {
		sb.WriteString("{}")
		return nil
	}
	if opts.sortKeys {
		pairs = append([]*exec.Pair(nil), pairs...)
		sort.SliceStable(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
	}
	sb.WriteByte('{')
	for i, p := range pairs {
		writePyJSONSeparator(sb, i, opts, depth+1)
		key, err := pyJSONKey(p.Key)
		if err != nil {
			return err
		}
		writePyJSONString(sb, key, opts.ensureASCII)
		sb.WriteString(opts.keySep)
		if err := writePyJSON(sb, p.Value, opts, depth+1); err != nil {
			return err
		}
	}
	writePyJSONClose(sb, opts, depth)
	sb.WriteByte('}')
	return nil
}

// pyJSONKey converts a dict key as json.dumps does: strings as they are,
// numbers, booleans and None to their JSON spelling.
func pyJSONKey(k *exec.Value) (string, error) {
	switch {
	case k.IsString():
		return k.String(), nil
	case k.IsNil():
		return "null", nil
	case k.IsBool():
		if k.Bool() {
			return "true", nil
		}
		return "false", nil
	case k.IsInteger():
		return strconv.Itoa(k.Integer()), nil
	case k.IsFloat():
		return pyFloatRepr(k.Float(), true), nil
	}
	return "", fmt.Errorf("tojson: keys must be str, int, float, bool or None, not %T", k.Interface())
}

func writePyJSONSeparator(sb *strings.Builder, i int, opts pyJSONOptions, depth int) {
	if i > 0 {
		sb.WriteString(opts.itemSep)
	}
	if opts.indent != nil {
		sb.WriteByte('\n')
		sb.WriteString(strings.Repeat(*opts.indent, depth))
	}
}

func writePyJSONClose(sb *strings.Builder, opts pyJSONOptions, depth int) {
	if opts.indent != nil {
		sb.WriteByte('\n')
		sb.WriteString(strings.Repeat(*opts.indent, depth))
	}
}

// writePyJSONString quotes s as json.dumps does.
func writePyJSONString(sb *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (ensureASCII && r >= 0x7F && r < 0x10000):
				sb.WriteString(`\u`)
				writeHex4(sb, r, hex)
			case ensureASCII && r >= 0x10000:
				hi, lo := utf16.EncodeRune(r)
				sb.WriteString(`\u`)
				writeHex4(sb, hi, hex)
				sb.WriteString(`\u`)
				writeHex4(sb, lo, hex)
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

func writeHex4(sb *strings.Builder, r rune, hex string) {
	sb.WriteByte(hex[(r>>12)&0xF])
	sb.WriteByte(hex[(r>>8)&0xF])
	sb.WriteByte(hex[(r>>4)&0xF])
	sb.WriteByte(hex[r&0xF])
}

// pyFloatRepr formats f as Python's repr(float); inJSON selects json.dumps'
// spelling of the non-finite values.
func pyFloatRepr(f float64, inJSON bool) string {
	switch {
	case math.IsNaN(f):
		if inJSON {
			return "NaN"
		}
		return "nan"
	case math.IsInf(f, 1):
		if inJSON {
			return "Infinity"
		}
		return "inf"
	case math.IsInf(f, -1):
		if inJSON {
			return "-Infinity"
		}
		return "-inf"
	}
	// Shortest round-trip digits, then Python's layout rule: positional for
	// decimal exponents -4..15, scientific otherwise.
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(sci, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign = "-"
			exp = -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

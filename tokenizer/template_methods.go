package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// engineStrMethods are the engine's string methods kept as they are; the
// ones below them in strMethodSet replace engine versions whose defaults or
// indexing differ from Python's.
var engineStrMethods = []string{
	"capitalize", "casefold", "center", "encode", "expandtabs", "format", "format_map",
	"isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
	"isnumeric", "isprintable", "isspace", "istitle", "isupper", "ljust", "partition",
	"rjust", "rpartition", "splitlines", "swapcase", "title", "zfill",
}

func strMethodSet() *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{}
	for _, name := range engineStrMethods {
		if fn, ok := builtins.Methods.Str.Get(name); ok {
			m[name] = fn
		}
	}
	m["strip"] = strStripMethod(true, true)
	m["lstrip"] = strStripMethod(true, false)
	m["rstrip"] = strStripMethod(false, true)
	m["split"] = strSplitMethod(false)
	m["rsplit"] = strSplitMethod(true)
	m["startswith"] = strAffixMethod(strings.HasPrefix)
	m["endswith"] = strAffixMethod(strings.HasSuffix)
	m["replace"] = strReplace
	m["upper"] = strNoArgs(strings.ToUpper)
	m["lower"] = strNoArgs(strings.ToLower)
	m["find"] = strFindMethod(false, false)
	m["rfind"] = strFindMethod(true, false)
	m["index"] = strFindMethod(false, true)
	m["rindex"] = strFindMethod(true, true)
	m["count"] = strCount
	m["join"] = strJoin
	m["removeprefix"] = strTrimAffix(strings.TrimPrefix)
	m["removesuffix"] = strTrimAffix(strings.TrimSuffix)
	return exec.NewMethodSet(m)
}

// pyIsSpace is Python's str.isspace for one character: Unicode White_Space
// plus the ASCII separators U+001C..U+001F.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1C && r <= 0x1F)
}

// optionalStringArg returns positional argument i as a string, or ok=false
// when it is absent or None.
func optionalStringArg(a *exec.VarArgs, i int, name string) (string, bool, error) {
	var v *exec.Value
	if i < len(a.Args) {
		v = a.Args[i]
	} else if kw, ok := a.KwArgs[name]; ok {
		v = kw
	}
	if v == nil || v.IsNil() {
		return "", false, nil
	}
	if !v.IsString() {
		return "", false, fmt.Errorf("%s must be a string or None, not %s", name, pyTypeName(v))
	}
	return v.String(), true, nil
}

func optionalIntArg(a *exec.VarArgs, i int, name string, fallback int) (int, error) {
	var v *exec.Value
	if i < len(a.Args) {
		v = a.Args[i]
	} else if kw, ok := a.KwArgs[name]; ok {
		v = kw
	}
	if v == nil || v.IsNil() {
		return fallback, nil
	}
	if !v.IsInteger() {
		return 0, fmt.Errorf("%s must be an integer, not %s", name, pyTypeName(v))
	}
	return v.Integer(), nil
}

func checkArity(a *exec.VarArgs, method string, max int) error {
	if len(a.Args) > max {
		return fmt.Errorf("%s() takes at most %d arguments (%d given)", method, max, len(a.Args))
	}
	return nil
}

// strStripMethod is str.strip/lstrip/rstrip: whitespace by default, else
// any of the given characters.
func strStripMethod(left, right bool) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if err := checkArity(a, "strip", 1); err != nil {
			return nil, err
		}
		chars, ok, err := optionalStringArg(a, 0, "chars")
		if err != nil {
			return nil, err
		}
		cut := pyIsSpace
		if ok {
			cut = func(r rune) bool { return strings.ContainsRune(chars, r) }
		}
		if left {
			self = strings.TrimLeftFunc(self, cut)
		}
		if right {
			self = strings.TrimRightFunc(self, cut)
		}
		return self, nil
	}
}

// strSplitMethod is str.split/rsplit with Python's sep=None behaviour:
// split on runs of whitespace and drop empty strings.
func strSplitMethod(fromRight bool) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if err := checkArity(a, "split", 2); err != nil {
			return nil, err
		}
		sep, hasSep, err := optionalStringArg(a, 0, "sep")
		if err != nil {
			return nil, err
		}
		maxsplit, err := optionalIntArg(a, 1, "maxsplit", -1)
		if err != nil {
			return nil, err
		}
		var parts []string
		switch {
		case hasSep && sep == "":
			return nil, errors.New("ValueError: empty separator")
		case hasSep && !fromRight:
			parts = strings.SplitN(self, sep, splitN(maxsplit))
		case hasSep:
			parts = rsplitN(self, sep, maxsplit)
		default:
			parts = splitWhitespace(self, maxsplit, fromRight)
		}
		out := make([]any, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, nil
	}
}

func splitN(maxsplit int) int {
	if maxsplit < 0 {
		return -1
	}
	return maxsplit + 1
}

func rsplitN(s, sep string, maxsplit int) []string {
	if maxsplit < 0 {
		return strings.Split(s, sep)
	}
	var parts []string
	for maxsplit > 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		parts = append(parts, s[i+len(sep):])
		s = s[:i]
		maxsplit--
	}
	parts = append(parts, s)
	slices.Reverse(parts)
	return parts
}

// splitWhitespace is str.split()/rsplit() without a separator. After
// maxsplit splits the remainder is kept whole, minus the whitespace at the
// end the splitting came from.
func splitWhitespace(s string, maxsplit int, fromRight bool) []string {
	if !fromRight {
		var parts []string
		s = strings.TrimLeftFunc(s, pyIsSpace)
		for s != "" {
			if maxsplit >= 0 && len(parts) == maxsplit {
				parts = append(parts, s)
				break
			}
			end := strings.IndexFunc(s, pyIsSpace)
			if end < 0 {
				parts = append(parts, s)
				break
			}
			parts = append(parts, s[:end])
			s = strings.TrimLeftFunc(s[end:], pyIsSpace)
		}
		return parts
	}
	var rev []string
	s = strings.TrimRightFunc(s, pyIsSpace)
	for s != "" {
		if maxsplit >= 0 && len(rev) == maxsplit {
			rev = append(rev, s)
			break
		}
		start := strings.LastIndexFunc(s, pyIsSpace)
		if start < 0 {
			rev = append(rev, s)
			break
		}
		_, size := utf8.DecodeRuneInString(s[start:])
		rev = append(rev, s[start+size:])
		s = strings.TrimRightFunc(s[:start], pyIsSpace)
	}
	slices.Reverse(rev)
	return rev
}

// strAffixMethod is str.startswith/endswith: the argument is a string or a
// tuple (list) of strings.
func strAffixMethod(has func(s, affix string) bool) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) < 1 || len(a.Args) > 3 {
			return nil, fmt.Errorf("startswith/endswith takes 1 to 3 arguments (%d given)", len(a.Args))
		}
		s, err := pySliceString(self, a)
		if err != nil {
			return nil, err
		}
		arg := a.Args[0]
		switch {
		case arg.IsString():
			return has(s, arg.String()), nil
		case arg.IsList():
			for i := 0; i < arg.Len(); i++ {
				item := arg.Index(i)
				if !item.IsString() {
					return nil, fmt.Errorf("tuple for startswith/endswith must only contain str, not %s", pyTypeName(item))
				}
				if has(s, item.String()) {
					return true, nil
				}
			}
			return false, nil
		}
		return nil, fmt.Errorf("startswith/endswith first arg must be str or a tuple of str, not %s", pyTypeName(arg))
	}
}

// pySliceString applies the optional start/end arguments (positions 1 and
// 2, in characters, negative from the end) of startswith/endswith/find.
func pySliceString(s string, a *exec.VarArgs) (string, error) {
	if len(a.Args) < 2 {
		return s, nil
	}
	runes := []rune(s)
	n := len(runes)
	start, err := optionalIntArg(a, 1, "start", 0)
	if err != nil {
		return "", err
	}
	end, err := optionalIntArg(a, 2, "end", n)
	if err != nil {
		return "", err
	}
	start, end = clampSliceBound(start, n), clampSliceBound(end, n)
	if start > end {
		return "", nil
	}
	return string(runes[start:end]), nil
}

func clampSliceBound(i, n int) int {
	if i < 0 {
		i += n
		if i < 0 {
			i = 0
		}
	}
	if i > n {
		i = n
	}
	return i
}

func strReplace(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
	if len(a.Args) < 2 || len(a.Args) > 3 {
		return nil, fmt.Errorf("replace() takes 2 or 3 arguments (%d given)", len(a.Args))
	}
	if !a.Args[0].IsString() || !a.Args[1].IsString() {
		return nil, errors.New("replace() arguments must be str")
	}
	count, err := optionalIntArg(a, 2, "count", -1)
	if err != nil {
		return nil, err
	}
	return strings.Replace(self, a.Args[0].String(), a.Args[1].String(), count), nil
}

func strNoArgs(fn func(string) string) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) > 0 || len(a.KwArgs) > 0 {
			return nil, errors.New("method takes no arguments")
		}
		return fn(self), nil
	}
}

// strFindMethod is find/rfind (-1 when missing) and index/rindex (an error
// when missing). Positions are in characters, as in Python.
func strFindMethod(fromRight, mustExist bool) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) != 1 || !a.Args[0].IsString() {
			return nil, errors.New("find/index takes one str argument")
		}
		sub := a.Args[0].String()
		var i int
		if fromRight {
			i = strings.LastIndex(self, sub)
		} else {
			i = strings.Index(self, sub)
		}
		if i < 0 {
			if mustExist {
				return nil, errors.New("ValueError: substring not found")
			}
			return -1, nil
		}
		return utf8.RuneCountInString(self[:i]), nil
	}
}

func strCount(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
	if len(a.Args) != 1 || !a.Args[0].IsString() {
		return nil, errors.New("count() takes one str argument")
	}
	sub := a.Args[0].String()
	if sub == "" {
		return utf8.RuneCountInString(self) + 1, nil
	}
	return strings.Count(self, sub), nil
}

func strJoin(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
	if len(a.Args) != 1 {
		return nil, errors.New("join() takes exactly one argument")
	}
	items, err := iterateValues(a.Args[0])
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if !it.IsString() {
			return nil, fmt.Errorf("sequence item %d: expected str instance, %s found", i, pyTypeName(it))
		}
		parts[i] = it.String()
	}
	return strings.Join(parts, self), nil
}

func strTrimAffix(trim func(s, affix string) string) exec.Method[string] {
	return func(self string, _ *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) != 1 || !a.Args[0].IsString() {
			return nil, errors.New("removeprefix/removesuffix takes one str argument")
		}
		return trim(self, a.Args[0].String()), nil
	}
}

// dictMethodSet implements get/items/keys/values in insertion order, as
// Python dicts iterate; the engine's versions sort the keys.
func dictMethodSet() *exec.MethodSet[map[string]any] {
	m := map[string]exec.Method[map[string]any]{}
	for _, name := range []string{"copy"} {
		if fn, ok := builtins.Methods.Dict.Get(name); ok {
			m[name] = fn
		}
	}
	m["get"] = func(_ map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) < 1 || len(a.Args) > 2 {
			return nil, fmt.Errorf("get expected 1 or 2 arguments, got %d", len(a.Args))
		}
		for _, p := range orderedPairs(self) {
			if p.Key.EqualValueTo(a.Args[0]) {
				return p.Value.Interface(), nil
			}
		}
		if len(a.Args) == 2 {
			return a.Args[1].Interface(), nil
		}
		return nil, nil
	}
	m["items"] = func(_ map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		if len(a.Args) > 0 {
			return nil, errors.New("items() takes no arguments")
		}
		return dictItemsList(self), nil
	}
	m["keys"] = func(_ map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		pairs := orderedPairs(self)
		out := make([]any, len(pairs))
		for i, p := range pairs {
			out[i] = p.Key
		}
		return out, nil
	}
	m["values"] = func(_ map[string]any, self *exec.Value, a *exec.VarArgs) (any, error) {
		pairs := orderedPairs(self)
		out := make([]any, len(pairs))
		for i, p := range pairs {
			out[i] = p.Value
		}
		return out, nil
	}
	return exec.NewMethodSet(m)
}

// orderedPairs returns a dict value's items: insertion order for our
// ordered dicts, sorted keys for Go maps (namespace, dict()), which have no
// order of their own.
func orderedPairs(v *exec.Value) []*exec.Pair {
	switch d := v.Interface().(type) {
	case *exec.Dict:
		return d.Pairs
	case exec.Dict:
		return d.Pairs
	}
	keys := v.Keys()
	sort.SliceStable(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	pairs := make([]*exec.Pair, 0, len(keys))
	for _, k := range keys {
		val, _ := v.GetItem(k.Interface())
		pairs = append(pairs, &exec.Pair{Key: k, Value: val})
	}
	return pairs
}

// dictItemsList returns [[key, value], ...] in dict order.
func dictItemsList(v *exec.Value) []any {
	pairs := orderedPairs(v)
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key, p.Value}
	}
	return out
}

// iterateValues lists the items of a list, the characters of a string, or
// the keys of a dict, as iterating them in Python does.
func iterateValues(v *exec.Value) ([]*exec.Value, error) {
	var out []*exec.Value
	switch {
	case v.IsString():
		for _, r := range v.String() {
			out = append(out, exec.AsValue(string(r)))
		}
	case v.IsList():
		for i := 0; i < v.Len(); i++ {
			out = append(out, v.Index(i))
		}
	case v.IsDict():
		for _, p := range orderedPairs(v) {
			out = append(out, p.Key)
		}
	default:
		return nil, fmt.Errorf("'%s' object is not iterable", pyTypeName(v))
	}
	return out, nil
}

// pyTypeName names a value's Python type, for error messages.
func pyTypeName(v *exec.Value) string {
	switch {
	case v == nil || v.IsNil():
		return "NoneType"
	case v.IsString():
		return "str"
	case v.IsBool():
		return "bool"
	case v.IsInteger():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	}
	return fmt.Sprintf("%T", v.Interface())
}

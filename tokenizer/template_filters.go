package tokenizer

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), keyword arguments allowed.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	opts := defaultPyJSONOptions()
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	if len(params.Args) > len(names) {
		return exec.AsValue(fmt.Errorf("tojson takes at most %d arguments", len(names)))
	}
	arg := func(i int) *exec.Value {
		if i < len(params.Args) {
			return params.Args[i]
		}
		if v, ok := params.KwArgs[names[i]]; ok {
			return v
		}
		return nil
	}
	for k := range params.KwArgs {
		known := false
		for _, n := range names {
			known = known || n == k
		}
		if !known {
			return exec.AsValue(fmt.Errorf("tojson got an unexpected keyword argument '%s'", k))
		}
	}
	if v := arg(0); v != nil {
		opts.ensureASCII = v.IsTrue()
	}
	if v := arg(1); v != nil && !v.IsNil() {
		var indent string
		switch {
		case v.IsInteger():
			indent = strings.Repeat(" ", max(v.Integer(), 0))
		case v.IsString():
			indent = v.String()
		default:
			return exec.AsValue(fmt.Errorf("tojson: indent must be an int or a string, not %s", pyTypeName(v)))
		}
		opts.indent = &indent
		opts.itemSep = ","
	}
	if v := arg(2); v != nil && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 || !v.Index(0).IsString() || !v.Index(1).IsString() {
			return exec.AsValue(errors.New("tojson: separators must be a pair of strings"))
		}
		opts.itemSep, opts.keySep = v.Index(0).String(), v.Index(1).String()
	}
	if v := arg(3); v != nil {
		opts.sortKeys = v.IsTrue()
	}
	out, err := pyJSONDumps(in, opts)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(out)
}

// filterItems is Jinja's items filter: a dict's (key, value) pairs in order.
func filterItems(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsNil() {
		return exec.AsValue([]any{})
	}
	if !in.IsDict() {
		return exec.AsValue(fmt.Errorf("items filter: can only get item pairs from a mapping, not %s", pyTypeName(in)))
	}
	return exec.AsValue(dictItemsList(in))
}

// filterLength is len(): characters for strings (the engine counts bytes),
// items for lists and dicts.
func filterLength(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	switch {
	case in.IsString():
		return exec.AsValue(utf8.RuneCountInString(in.String()))
	case in.IsList(), in.IsDict():
		return exec.AsValue(in.Len())
	case in.IsNil():
		return exec.AsValue(0)
	}
	return exec.AsValue(fmt.Errorf("object of type '%s' has no len()", pyTypeName(in)))
}

// filterTrim is Jinja's trim: str.strip(chars), whitespace by default.
func filterTrim(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	s := in.String()
	chars, ok, err := optionalStringArg(params, 0, "chars")
	if err != nil {
		return exec.AsValue(err)
	}
	if ok {
		return exec.AsValue(strings.Trim(s, chars))
	}
	return exec.AsValue(strings.TrimFunc(s, pyIsSpace))
}

// filterDictSort is Jinja's dictsort(case_sensitive=False, by="key",
// reverse=False): the (key, value) pairs sorted.
func filterDictSort(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if !in.IsDict() {
		return exec.AsValue(fmt.Errorf("dictsort: can only sort a mapping, not %s", pyTypeName(in)))
	}
	caseSensitive := params.GetKeywordArgument("case_sensitive", false).IsTrue()
	byValue := params.GetKeywordArgument("by", "key").String() == "value"
	reverse := params.GetKeywordArgument("reverse", false).IsTrue()
	if len(params.Args) > 0 {
		caseSensitive = params.Args[0].IsTrue()
	}
	if len(params.Args) > 1 {
		byValue = params.Args[1].String() == "value"
	}
	if len(params.Args) > 2 {
		reverse = params.Args[2].IsTrue()
	}
	pairs := append([]*exec.Pair(nil), orderedPairs(in)...)
	sortKey := func(p *exec.Pair) string {
		v := p.Key
		if byValue {
			v = p.Value
		}
		if caseSensitive {
			return v.String()
		}
		return strings.ToLower(v.String())
	}
	sort.SliceStable(pairs, func(i, j int) bool {
		if reverse {
			return sortKey(pairs[i]) > sortKey(pairs[j])
		}
		return sortKey(pairs[i]) < sortKey(pairs[j])
	})
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.Key, p.Value}
	}
	return exec.AsValue(out)
}

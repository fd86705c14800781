package structured

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The qwen3_coder format writes each argument as bare text between <parameter=P>\n and
// \n</parameter>, and how the text reads as JSON is the parameter's ValueReading
// (coderparams.go), which the server's parser (server/toolcall_coder.go) reads it by too.
// The value grammars follow that reading, so what the model writes reads as a value the
// schema allows: a string is raw text (which cannot contain the format's markers, see
// coderMarkers), numbers and booleans are literals, objects and arrays are JSON (llguidance's
// %json of the parameter's schema), and null is also Python's None, as the chat template
// renders it.

// coderCall adds a qwen3_coder call of one tool and returns its body's rule name:
// NAME>\n then the parameters (the "<function=" before and "</function>" after are the
// call rule's).
func (w *larkWriter) coderCall(i int, name string, root *value) (string, error) {
	if err := checkCoderName(name); err != nil {
		return "", err
	}
	body := "tool" + strconv.Itoa(i)
	parts := []string{larkString(name + ">\n")}

	if root == nil {
		root = &value{kind: kObject} // any parameters
	}
	r := newSchemaRefs(root)
	obj, alt, err := r.top()
	switch {
	case err != nil:
		return "", fmt.Errorf("parameters schema: %w", err)
	case alt != "":
		// The format lists parameters one by one, so they must be declared there;
		// alternatives between whole argument sets cannot be laid out.
		return "", fmt.Errorf("parameters schema has %s at the top: the qwen3_coder format needs the parameters declared in \"properties\"", alt)
	}
	props := obj.get("properties")
	addl := obj.get("additionalProperties")
	if props == nil && !(addl != nil && addl.kind == kBool && !addl.truth) {
		// No declared parameters and none forbidden: any parameters, as raw text (the
		// parser reads an undeclared parameter as a string).
		param := w.name("free")
		w.rule(param, larkString(parameterOpen)+" FREE_NAME "+larkString(">\n")+" "+w.rawToken(nil, nil))
		if !w.hasFreeName {
			w.rule("FREE_NAME", `/[A-Za-z_][A-Za-z0-9_.\-]*/`)
			w.hasFreeName = true
		}
		parts = append(parts, param+"*")
		w.rule(body, strings.Join(parts, " "))
		return body, nil
	}

	for _, p := range r.params(obj) {
		if p.schema.kind == kBool && !p.schema.truth {
			if p.required {
				return "", fmt.Errorf("parameter %q is required but its schema is false", p.name)
			}
			continue // may not appear
		}
		if err := checkCoderName(p.name); err != nil {
			return "", fmt.Errorf("parameter %w", err)
		}
		v, err := w.coderValue(r, p)
		if err != nil {
			return "", fmt.Errorf("parameter %q: %w", p.name, err)
		}
		param := w.name("param")
		w.rule(param, larkString(parameterOpen+p.name+">\n")+" "+v)
		if !p.required {
			param += "?"
		}
		parts = append(parts, param)
	}
	w.rule(body, strings.Join(parts, " "))
	return body, nil
}

// checkCoderName refuses a function or parameter name the format cannot carry: the parser
// reads a name up to the first ">" and trims spaces around it.
func checkCoderName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("has an empty name")
	case strings.ContainsAny(name, "<>\n"):
		return fmt.Errorf("%q cannot be written in the qwen3_coder format (it has <, > or a newline)", name)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("%q cannot be written in the qwen3_coder format (it starts or ends with a space)", name)
	}
	return nil
}

// coderValue adds the grammar of one parameter's value, closing tag included, and returns
// the rule or token to use after <parameter=P>\n.
func (w *larkWriter) coderValue(r *schemaRefs, p coderParameter) (string, error) {
	vg, err := coderValueGrammar(r, p.schema, p.reading)
	if err != nil {
		return "", err
	}
	var alts []string
	seen := map[string]bool{}
	for _, lit := range vg.literals {
		if !seen[lit] {
			seen[lit] = true
			alts = append(alts, larkString(lit+valueClose))
		}
	}
	for _, r := range vg.raw {
		alts = append(alts, w.rawToken(r.include, r.exclude))
	}
	if vg.json != nil {
		alts = append(alts, w.jsonDoc(vg.json, coderMarkers)+" "+larkString(valueClose))
	}
	if len(alts) == 0 {
		return "", fmt.Errorf("no value is allowed")
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	name := w.name("value")
	w.rule(name, strings.Join(alts, " | "))
	return name, nil
}

// rawToken adds a token for raw text that matches every include regex (any text when
// there are none), no exclude regex and contains no marker, followed by the closing
// \n</parameter>\n. The closing tag is part of the token: since the text cannot contain
// </parameter>, the token ends exactly at the first one, and the lexer never has to guess
// where the text stops.
func (w *larkWriter) rawToken(include, exclude []string) string {
	var terms []string
	for _, re := range include {
		terms = append(terms, larkRegex(re))
	}
	if len(terms) == 0 {
		terms = append(terms, larkRegex(anyText))
	}
	for _, re := range append(exclude, containsAny(coderMarkers)) {
		terms = append(terms, "~"+larkRegex(re))
	}
	tok := strings.ToUpper(w.name("text"))
	w.rule(tok, "("+strings.Join(terms, " & ")+") "+larkString(valueClose))
	return tok
}

// valueGrammar is a parameter value: one of the literal texts, raw text matching one of
// the raw alternatives, or JSON of a schema document.
type valueGrammar struct {
	literals []string
	raw      []rawAlt
	json     *value
}

type rawAlt struct{ include, exclude []string }

// Regexes of raw text that a reading does not take as a string, kept out of its strings:
// nullText, what reads as null ("text", "untyped", "json"), noneText, what reads as null
// where None does (Nullable), untypedJSON, what "untyped" may read as JSON, and jsonText,
// what "json" may read as JSON (or as True, False) rather than as a string. jsonText also
// keeps out text that only starts as JSON's true, false and null do: llguidance's lexer
// takes the longest token, so raw text that could go on where the JSON document's literal
// ends would leave the document's closing tag no way in.
const (
	nullText    = `\s*(?i:null)\s*`
	noneText    = `\s*None\s*`
	untypedJSON = `\s*[\[{](?s:.*)`
	jsonText    = `\s*(?:[-0-9"\[{]|true|false|null)(?s:.*)|\s*(?:True|False)\s*`
)

// coderValueGrammar is the texts of a parameter of schema s that read (rd) as values s
// allows.
func coderValueGrammar(r *schemaRefs, s *value, rd ValueReading) (valueGrammar, error) {
	var vg valueGrammar
	var err error
	k := rd.kinds
	switch rd.Kind {
	case readString:
		vg, err = r.stringValues(s, nullable(rd, nil))
	case readText:
		vg, err = r.stringValues(s, nullable(rd, []string{nullText}))
		if err == nil && k&kindNull != 0 {
			vg.literals = append(vg.literals, "null")
		}
	case readEnum:
		vg = enumValues(rd)
	case readInteger, readNumber:
		vg.json = numberDoc(r.root, s, rd)
	case readBoolean:
		vg.literals = boolLiterals(k, true, true)
		if k&kindNull != 0 {
			vg.literals = append(vg.literals, "null")
		}
	case readJSON:
		if k&kindString != 0 {
			// Strings raw, as the chat template renders them, where the text cannot read
			// as anything else (and as JSON strings, in the document).
			if strs, err := r.stringValues(s, nullable(rd, []string{nullText, jsonText})); err == nil {
				vg = strs
			}
		}
		vg.literals = append(vg.literals, boolLiterals(k, false, true)...)
		vg.json = embed(r.root, s)
	case readUntyped:
		switch {
		case k == 0:
			return valueGrammar{}, fmt.Errorf("no value is allowed")
		case allowsAll(s):
			// Anything goes: whatever the parser makes of the text is valid.
			return valueGrammar{raw: []rawAlt{{}}}, nil
		}
		if strs, err := r.stringValues(s, []string{nullText, untypedJSON}); err == nil {
			vg = strs
		}
		// null (its kinds are all), and objects and arrays as JSON, where the schema
		// allows them.
		vg.literals = append(vg.literals, "null")
		types := arrValue(strValue("object"), strValue("array"))
		vg.json = embed(r.root, objValue("allOf", arrValue(s.clone(), objValue("type", types))))
	}
	if err != nil {
		return vg, err
	}
	if rd.Nullable && !(rd.Kind == readEnum && enumHasString(rd, "None")) {
		vg.literals = append(vg.literals, "None")
	}
	return vg, nil
}

// nullable adds to a reading's exclude regexes what reads as null where None does.
func nullable(rd ValueReading, exclude []string) []string {
	if rd.Nullable {
		return append(exclude, noneText)
	}
	return exclude
}

// boolLiterals is how the booleans among the kinds k are written: JSON's true and false
// (with json), Python's True and False (with python), as the chat template renders them.
func boolLiterals(k int, json, python bool) []string {
	var lits []string
	for _, b := range []struct {
		kind         int
		json, python string
	}{{kindTrue, "true", "True"}, {kindFalse, "false", "False"}} {
		if k&b.kind != 0 && json {
			lits = append(lits, b.json)
		}
		if k&b.kind != 0 && python {
			lits = append(lits, b.python)
		}
	}
	return lits
}

// enumValues is an enum without a type: its strings as they are (the parser reads "null"
// as JSON null, so a string that reads so is left out), its booleans also as Python writes
// them, objects and arrays as JSON, and other values as their JSON text.
func enumValues(rd ValueReading) valueGrammar {
	var vg valueGrammar
	var docs []*value
	for _, e := range rd.members {
		switch e.kind {
		case kString:
			if !strings.EqualFold(strings.TrimSpace(e.str), "null") && !containsMarker(e.str) {
				vg.literals = append(vg.literals, e.str)
			}
		case kBool:
			vg.literals = append(vg.literals, boolLiterals(kindOfValue(e), true, true)...)
		case kArray, kObject:
			docs = append(docs, e)
		default:
			vg.literals = append(vg.literals, e.encode())
		}
	}
	if len(docs) > 0 {
		vg.json = objValue("enum", arrValue(docs...))
	}
	return vg
}

func enumHasString(rd ValueReading, s string) bool {
	for _, m := range rd.members {
		if m.kind == kString && m.str == s {
			return true
		}
	}
	return false
}

// allowsAll reports whether s allows every value: true, or an object of annotations only.
func allowsAll(s *value) bool {
	if !s.isObject() {
		return s == nil || s.kind != kBool || s.truth
	}
	for _, k := range s.keys {
		switch k {
		case "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
			"$id", "$schema", "$anchor", "$defs", "definitions":
		default:
			if !strings.HasPrefix(k, "x-") {
				return false
			}
		}
	}
	return true
}

// numberDoc is the JSON document of an integer or number parameter: its schema, narrowed
// to numbers (and null) when it allows other types too, whose text the parser would not
// read as the schema means.
func numberDoc(root, s *value, rd ValueReading) *value {
	types := []*value{strValue(rd.Kind)}
	if rd.Nullable {
		types = append(types, strValue("null"))
	}
	plain := s.get("anyOf") == nil && s.get("oneOf") == nil && s.get("allOf") == nil && s.get("$ref") == nil
	if t := s.get("type"); plain && t != nil && t.kind == kArray {
		for _, e := range t.vals {
			plain = plain && (e.str == rd.Kind || e.str == "null")
		}
	}
	if plain {
		return embed(root, s)
	}
	return embed(root, objValue("allOf", arrValue(s.clone(), objValue("type", arrValue(types...)))))
}

// strAlt is one set of constraints on a string: all must hold.
type strAlt struct {
	hasEnum  bool
	enum     []string // with hasEnum: exactly these strings
	patterns []string // JSON Schema patterns (unanchored)
	formats  []string // regexes of formats (formatRegex)
	minLen   int      // in characters
	maxLen   int      // -1: none
}

// stringAlts is the strings s allows, as alternatives of constraint sets: s's own string
// keywords, combined with those of its $ref and allOf (all hold) and its anyOf/oneOf
// branches (one holds; oneOf's "exactly one" is not checked). nil when s allows no string.
func (r *schemaRefs) stringAlts(s *value) ([]strAlt, error) {
	anyStr := []strAlt{{maxLen: -1}}
	if s == nil {
		return anyStr, nil
	}
	if !s.isObject() {
		if s.truth {
			return anyStr, nil
		}
		return nil, nil
	}
	if kindsOfTypes(s)&kindString == 0 {
		return nil, nil
	}
	own := strAlt{maxLen: -1}
	if e := s.get("enum"); e != nil {
		own.hasEnum = true
		for _, m := range e.vals {
			if m.kind == kString {
				own.enum = append(own.enum, m.str)
			}
		}
	}
	if c := s.get("const"); c != nil {
		if c.kind != kString {
			return nil, nil
		}
		own = intersectStr(own, strAlt{hasEnum: true, enum: []string{c.str}, maxLen: -1})
	}
	if p := s.get("pattern"); p != nil {
		own.patterns = append(own.patterns, p.str)
	}
	if f := s.get("format"); f != nil {
		if re := formatRegex(f.str); re != "" {
			own.formats = append(own.formats, re)
		}
	}
	if m := s.get("minLength"); m != nil {
		n, _ := strconv.Atoi(m.num)
		own.minLen = n
	}
	if m := s.get("maxLength"); m != nil {
		n, _ := strconv.Atoi(m.num)
		own.maxLen = n
	}
	alts := []strAlt{own}
	combine := func(others []strAlt) error {
		var out []strAlt
		for _, a := range alts {
			for _, b := range others {
				if c := intersectStr(a, b); !c.empty() {
					out = append(out, c)
				}
			}
		}
		if len(out) > 64 {
			return fmt.Errorf("too many alternative string forms")
		}
		alts = out
		return nil
	}
	if ref := s.get("$ref"); ref != nil {
		target, err := r.resolve(ref.str)
		if err != nil {
			return nil, err
		}
		t, err := r.refStrings(target)
		if err != nil {
			return nil, err
		}
		if err := combine(t); err != nil {
			return nil, err
		}
	}
	if all := s.get("allOf"); all != nil {
		for _, b := range all.vals {
			t, err := r.stringAlts(b)
			if err != nil {
				return nil, err
			}
			if err := combine(t); err != nil {
				return nil, err
			}
		}
	}
	for _, comb := range []string{"anyOf", "oneOf"} {
		if branches := s.get(comb); branches != nil {
			var u []strAlt
			for _, b := range branches.vals {
				t, err := r.stringAlts(b)
				if err != nil {
					return nil, err
				}
				u = append(u, t...)
			}
			if err := combine(u); err != nil {
				return nil, err
			}
		}
	}
	return alts, nil
}

// refStrings is the strings a $ref target allows, worked out once. A target met again
// while its own strings are being worked out (a cycle) allows none there: a string reached
// only round a cycle is refused rather than loosened, and every walk ends.
func (r *schemaRefs) refStrings(target *value) ([]strAlt, error) {
	if m, done := r.strs[target]; done {
		return m.alts, m.err
	}
	r.strs[target] = strAlts{} // while in progress
	alts, err := r.stringAlts(target)
	r.strs[target] = strAlts{alts, err}
	return alts, err
}

// kindsOfTypes is the kinds s's own "type" allows (all without one).
func kindsOfTypes(s *value) int {
	if s.get("type") == nil {
		return allKinds
	}
	k := 0
	for _, t := range schemaTypes(s) {
		k |= kindOfType(t)
	}
	return k
}

func intersectStr(a, b strAlt) strAlt {
	c := strAlt{
		patterns: append(append([]string(nil), a.patterns...), b.patterns...),
		formats:  append(append([]string(nil), a.formats...), b.formats...),
		minLen:   max(a.minLen, b.minLen),
		maxLen:   a.maxLen,
	}
	if b.maxLen >= 0 && (c.maxLen < 0 || b.maxLen < c.maxLen) {
		c.maxLen = b.maxLen
	}
	switch {
	case a.hasEnum && b.hasEnum:
		c.hasEnum = true
		for _, x := range a.enum {
			for _, y := range b.enum {
				if x == y {
					c.enum = append(c.enum, x)
					break
				}
			}
		}
	case a.hasEnum:
		c.hasEnum, c.enum = true, a.enum
	case b.hasEnum:
		c.hasEnum, c.enum = true, b.enum
	}
	return c
}

func (a strAlt) empty() bool {
	return (a.hasEnum && len(a.enum) == 0) || (a.maxLen >= 0 && a.minLen > a.maxLen)
}

// stringValues is a string parameter's raw-text values: one literal per allowed enum or
// const string, or raw text under the pattern, format and length constraints; exclude
// lists regexes of text to keep out besides the markers.
func (r *schemaRefs) stringValues(s *value, exclude []string) (valueGrammar, error) {
	alts, err := r.stringAlts(s)
	if err != nil {
		return valueGrammar{}, err
	}
	var vg valueGrammar
	for _, a := range alts {
		if a.empty() {
			continue
		}
		if a.hasEnum {
			for _, e := range a.enum {
				if a.allows(e) && !matchesAny(exclude, e) {
					vg.literals = append(vg.literals, e)
				}
			}
			continue
		}
		var include []string
		for _, p := range a.patterns {
			include = append(include, searchRegex(p))
		}
		include = append(include, a.formats...)
		if a.minLen > 0 || a.maxLen >= 0 {
			bound := strconv.Itoa(a.minLen) + ","
			if a.maxLen >= 0 {
				bound += strconv.Itoa(a.maxLen)
			}
			include = append(include, "(?s:.{"+bound+"})")
		}
		vg.raw = append(vg.raw, rawAlt{include: include, exclude: exclude})
	}
	if len(vg.literals) == 0 && len(vg.raw) == 0 {
		return vg, fmt.Errorf("no string value is allowed")
	}
	return vg, nil
}

// allows reports whether the enum string e meets a's other constraints and can be written
// as raw text. A pattern Go's regexp cannot read is left to the enum.
func (a strAlt) allows(e string) bool {
	if containsMarker(e) {
		return false
	}
	n := utf8.RuneCountInString(e)
	if n < a.minLen || (a.maxLen >= 0 && n > a.maxLen) {
		return false
	}
	for _, p := range a.patterns {
		if re, err := regexp.Compile(p); err == nil && !re.MatchString(e) {
			return false
		}
	}
	for _, f := range a.formats {
		if !regexp.MustCompile(`^(?:` + f + `)$`).MatchString(e) {
			return false
		}
	}
	return true
}

func containsMarker(s string) bool {
	for _, m := range coderMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

func matchesAny(regexes []string, s string) bool {
	for _, r := range regexes {
		if regexp.MustCompile(`^(?:` + r + `)$`).MatchString(s) {
			return true
		}
	}
	return false
}

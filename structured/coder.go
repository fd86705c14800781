package structured

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The qwen3_coder format writes each argument as bare text between <parameter=P>\n and
// \n</parameter>, and the server's parser (server/toolcall_coder.go: schemaType,
// coderValue) turns the text into a JSON value by the parameter's schema: the schema's
// "type" (the first non-null one of a list), else the type of its first typed anyOf/oneOf
// branch, else "enum" when it has an enum, else nothing ("untyped"). Then:
//
//	string, enum: the text is the string, exactly (for enum, "null" is JSON null);
//	integer, number, boolean: the text read as one ("true"/"True"; "null" is null);
//	object, array and others: the text read as JSON;
//	untyped: JSON when the text is a JSON object or array, null for "null", else a string.
//
// The value grammars follow that reading, so what the model writes parses to a value the
// schema allows: a string is raw text (which cannot contain the format's markers, see
// coderMarkers), numbers and booleans are literals, objects and arrays are JSON (llguidance's
// %json of the parameter's schema).

// coderCall adds a qwen3_coder call of one tool and returns its body's rule name:
// NAME>\n then the parameters (the "<function=" before and "</function>" after are the
// call rule's).
func (w *larkWriter) coderCall(i int, name string, root *value) (string, error) {
	if err := checkCoderName(name); err != nil {
		return "", err
	}
	body := "tool" + strconv.Itoa(i)
	parts := []string{larkString(name + ">\n")}

	obj := root
	if root != nil {
		var err error
		if obj, err = topObject(root); err != nil {
			return "", err
		}
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

	required := map[string]bool{}
	if req := obj.get("required"); req != nil {
		for _, r := range req.vals {
			required[r.str] = true
		}
	}
	// Parameters in the order the schema declares them, then required ones it does not
	// declare (valued by additionalProperties).
	var names []string
	var schemas []*value
	declared := map[string]bool{}
	if props != nil {
		for j, p := range props.keys {
			names = append(names, p)
			schemas = append(schemas, props.vals[j])
			declared[p] = true
		}
	}
	if req := obj.get("required"); req != nil {
		for _, r := range req.vals {
			if !declared[r.str] {
				declared[r.str] = true
				s := addl
				if s == nil {
					s = &value{kind: kBool, truth: true}
				}
				names = append(names, r.str)
				schemas = append(schemas, s)
			}
		}
	}
	for j, p := range names {
		s := schemas[j]
		if s.kind == kBool && !s.truth {
			if required[p] {
				return "", fmt.Errorf("parameter %q is required but its schema is false", p)
			}
			continue // may not appear
		}
		if err := checkCoderName(p); err != nil {
			return "", fmt.Errorf("parameter %w", err)
		}
		v, err := w.coderValue(root, s)
		if err != nil {
			return "", fmt.Errorf("parameter %q: %w", p, err)
		}
		param := w.name("param")
		w.rule(param, larkString(parameterOpen+p+">\n")+" "+v)
		if !required[p] {
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

// topObject is the object schema that lists a tool's parameters: the root, or what its
// $ref leads to. The format lists parameters one by one, so the parameters must be
// declared there; alternatives between whole argument sets (anyOf, oneOf, allOf at the top)
// cannot be laid out and are refused.
func topObject(root *value) (*value, error) {
	s := root
	for hops := 0; ; hops++ {
		if !s.isObject() {
			return &value{kind: kObject}, nil // true: any parameters
		}
		for _, k := range []string{"anyOf", "oneOf", "allOf"} {
			if s.get(k) != nil {
				return nil, fmt.Errorf("parameters schema has %s at the top: the qwen3_coder format needs the parameters declared in \"properties\"", k)
			}
		}
		r := s.get("$ref")
		if r == nil {
			return s, nil
		}
		if hops > 32 {
			return nil, fmt.Errorf("parameters schema: too many $ref hops")
		}
		target, _, err := newChecker(root).resolve(r.str)
		if err != nil {
			return nil, err
		}
		s = target
	}
}

// coderValue adds the grammar of one parameter's value, closing tag included, and returns
// the rule or token to use after <parameter=P>\n.
func (w *larkWriter) coderValue(root, s *value) (string, error) {
	vg, err := coderValueGrammar(root, s)
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
	r := w.name("value")
	w.rule(r, strings.Join(alts, " | "))
	return r, nil
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

// untypedExclude keeps raw text that the parser would not read as a string out of an
// untyped parameter's string values: text starting with [ or { (JSON, when it parses) and
// null.
var untypedExclude = []string{`\s*[\[{](?s:.*)`, `\s*(?i:null)\s*`}

func coderValueGrammar(root, s *value) (valueGrammar, error) {
	typ := parserType(s)
	if typ == "" {
		typ = "untyped"
	}
	switch typ {
	case "string":
		return stringValues(root, s, nil)
	case "enum":
		return enumValues(s), nil
	case "integer", "number":
		return valueGrammar{json: numberDoc(root, s, typ)}, nil
	case "boolean":
		return boolValues(s), nil
	case "untyped":
		k := kindsOf(root, s, 0)
		switch {
		case k == 0:
			return valueGrammar{}, fmt.Errorf("no value is allowed")
		case k == allKinds && isAnyString(root, s):
			// Anything goes: whatever the parser makes of the text is valid.
			return valueGrammar{raw: []rawAlt{{}}}, nil
		case k&^(kindObject|kindArray|kindNull) == 0:
			return valueGrammar{json: embed(root, s)}, nil
		case k&^(kindString|kindNull) == 0:
			vg, err := stringValues(root, s, untypedExclude)
			if err == nil && k&kindNull != 0 {
				vg.literals = append(vg.literals, "null")
			}
			return vg, err
		}
		// Numbers, booleans or a mix: the value as JSON, as the schema wants it.
		return valueGrammar{json: embed(root, s)}, nil
	}
	// object, array, null: the parser reads the text as JSON.
	return valueGrammar{json: embed(root, s)}, nil
}

// parserType mirrors the server's qwen3_coder parser (server/toolcall_coder.go): the type
// it reads a parameter's text as, from the parameter's own type, else the first anyOf or
// oneOf branch with a type of its own (a branch's enum is not its type: only the
// parameter's own enum makes it "enum"), else its own enum. Where this gives nothing the
// kinds the schema allows decide (kindsOf), $refs followed.
func parserType(s *value) string {
	if !s.isObject() {
		return ""
	}
	if t := s.get("type"); t != nil {
		switch t.kind {
		case kString:
			return strings.ToLower(t.str)
		case kArray:
			for _, e := range t.vals {
				if e.kind == kString && e.str != "null" {
					return strings.ToLower(e.str)
				}
			}
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches := s.get(k); branches != nil {
			for _, b := range branches.vals {
				if t := parserType(b); t != "" && t != "null" && t != "enum" {
					return t
				}
			}
		}
	}
	if e := s.get("enum"); e != nil && e.kind == kArray && len(e.vals) > 0 {
		return "enum"
	}
	return ""
}

// enumValues is an enum without a type: its strings as they are (the parser reads "null"
// as JSON null, so a string that reads so is left out), null as null, and other values as
// their JSON text.
func enumValues(s *value) valueGrammar {
	var vg valueGrammar
	for _, e := range s.get("enum").vals {
		switch {
		case e.kind == kString:
			if !strings.EqualFold(strings.TrimSpace(e.str), "null") && !containsMarker(e.str) {
				vg.literals = append(vg.literals, e.str)
			}
		default:
			vg.literals = append(vg.literals, e.encode())
		}
	}
	return vg
}

// boolValues is a boolean parameter: true and false (also as Python writes them, True and
// False, which the templates render and the parser reads), null if the schema allows it,
// each only if the schema's enum or const allows it.
func boolValues(s *value) valueGrammar {
	allowed := func(v *value) bool {
		if c := s.get("const"); c != nil && !sameJSON(c, v) {
			return false
		}
		if e := s.get("enum"); e != nil {
			for _, m := range e.vals {
				if sameJSON(m, v) {
					return true
				}
			}
			return false
		}
		return true
	}
	var vg valueGrammar
	if allowed(&value{kind: kBool, truth: true}) {
		vg.literals = append(vg.literals, "true", "True")
	}
	if allowed(&value{kind: kBool}) {
		vg.literals = append(vg.literals, "false", "False")
	}
	if nullAllowed(s) && allowed(&value{kind: kNull}) {
		vg.literals = append(vg.literals, "null")
	}
	return vg
}

func sameJSON(a, b *value) bool { return a.encode() == b.encode() }

// nullAllowed reports whether s lists null among its types (in "type" or as an
// anyOf/oneOf branch) or in its enum.
func nullAllowed(s *value) bool {
	if !s.isObject() {
		return s != nil && s.truth
	}
	if t := s.get("type"); t != nil && t.kind == kArray {
		for _, e := range t.vals {
			if e.kind == kString && e.str == "null" {
				return true
			}
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches := s.get(k); branches != nil {
			for _, b := range branches.vals {
				if parserType(b) == "null" || (b.isObject() && b.get("type") == nil && nullAllowed(b)) {
					return true
				}
			}
		}
	}
	if e := s.get("enum"); e != nil {
		for _, m := range e.vals {
			if m.kind == kNull {
				return true
			}
		}
	}
	return false
}

// numberDoc is the JSON document of an integer or number parameter: its schema, narrowed
// to numbers (and null) when it allows other types too, whose text the parser would not
// read as the schema means.
func numberDoc(root, s *value, typ string) *value {
	types := []*value{strValue(typ)}
	if nullAllowed(s) {
		types = append(types, strValue("null"))
	}
	plain := s.get("anyOf") == nil && s.get("oneOf") == nil && s.get("allOf") == nil && s.get("$ref") == nil
	if t := s.get("type"); plain && t != nil && t.kind == kArray {
		for _, e := range t.vals {
			plain = plain && (e.str == typ || e.str == "null")
		}
	}
	if plain {
		return embed(root, s)
	}
	return embed(root, objValue("allOf", arrValue(s.clone(), objValue("type", arrValue(types...)))))
}

// JSON kinds a schema allows, as a bit set (integers count as numbers).
const (
	kindNull = 1 << iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
	allKinds = kindNull | kindBool | kindNumber | kindString | kindArray | kindObject
)

func kindOfType(t string) int {
	switch t {
	case "null":
		return kindNull
	case "boolean":
		return kindBool
	case "integer", "number":
		return kindNumber
	case "string":
		return kindString
	case "array":
		return kindArray
	case "object":
		return kindObject
	}
	return 0
}

func kindOfValue(v *value) int {
	switch v.kind {
	case kNull:
		return kindNull
	case kBool:
		return kindBool
	case kNumber:
		return kindNumber
	case kString:
		return kindString
	case kArray:
		return kindArray
	}
	return kindObject
}

// kindsOf is the set of JSON kinds s allows, following $ref and the combinators.
func kindsOf(root, s *value, depth int) int {
	if s == nil {
		return allKinds
	}
	if !s.isObject() {
		if s.truth {
			return allKinds
		}
		return 0
	}
	if depth > 32 {
		return allKinds
	}
	k := allKinds
	if t := s.get("type"); t != nil {
		k = 0
		for _, name := range schemaTypes(s) {
			k |= kindOfType(name)
		}
	}
	if e := s.get("enum"); e != nil {
		lits := 0
		for _, m := range e.vals {
			lits |= kindOfValue(m)
		}
		k &= lits
	}
	if c := s.get("const"); c != nil {
		k &= kindOfValue(c)
	}
	if r := s.get("$ref"); r != nil {
		if target, _, err := newChecker(root).resolve(r.str); err == nil {
			k &= kindsOf(root, target, depth+1)
		}
	}
	if all := s.get("allOf"); all != nil {
		for _, b := range all.vals {
			k &= kindsOf(root, b, depth+1)
		}
	}
	for _, comb := range []string{"anyOf", "oneOf"} {
		if branches := s.get(comb); branches != nil {
			u := 0
			for _, b := range branches.vals {
				u |= kindsOf(root, b, depth+1)
			}
			k &= u
		}
	}
	return k
}

// isAnyString reports whether every string is valid for s.
func isAnyString(root, s *value) bool {
	alts, err := stringAlts(root, s, 0)
	if err != nil {
		return false
	}
	for _, a := range alts {
		if !a.hasEnum && len(a.patterns) == 0 && len(a.formats) == 0 && a.minLen == 0 && a.maxLen < 0 {
			return true
		}
	}
	return false
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
func stringAlts(root, s *value, depth int) ([]strAlt, error) {
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
	if depth > 32 {
		return nil, nil // a string through 32 refs: refuse it rather than loosen it
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
	if r := s.get("$ref"); r != nil {
		target, _, err := newChecker(root).resolve(r.str)
		if err != nil {
			return nil, err
		}
		t, err := stringAlts(root, target, depth+1)
		if err != nil {
			return nil, err
		}
		if err := combine(t); err != nil {
			return nil, err
		}
	}
	if all := s.get("allOf"); all != nil {
		for _, b := range all.vals {
			t, err := stringAlts(root, b, depth+1)
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
				t, err := stringAlts(root, b, depth+1)
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
func stringValues(root, s *value, exclude []string) (valueGrammar, error) {
	alts, err := stringAlts(root, s, 0)
	if err != nil {
		return valueGrammar{}, err
	}
	var vg valueGrammar
	for _, a := range alts {
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

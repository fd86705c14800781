package structured

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// SchemaError is a schema this engine cannot enforce. Path locates the schema object that
// holds the offending keyword, as the keys and array indexes leading to it joined by dots
// ("properties.tags.items", "anyOf.1"; "" is the root); Keyword is the keyword.
type SchemaError struct {
	Path, Keyword, Msg string
}

func (e *SchemaError) Error() string {
	where := "the schema's root"
	if e.Path != "" {
		where = e.Path
	}
	if e.Keyword == "" {
		return fmt.Sprintf("schema at %s: %s", where, e.Msg)
	}
	return fmt.Sprintf("schema keyword %q at %s: %s", e.Keyword, where, e.Msg)
}

// draft is a JSON Schema version, in order. llguidance reads the root's $schema to pick one
// (2020-12 when absent or unknown), and the version decides which keywords exist.
type draft int

const (
	draft4 draft = iota
	draft6
	draft7
	draft2019
	draft2020
)

func detectDraft(root *value) draft {
	s := root.get("$schema")
	if s == nil || s.kind != kString {
		return draft2020
	}
	switch strings.TrimRight(s.str, "#") {
	case "http://json-schema.org/draft-04/schema":
		return draft4
	case "http://json-schema.org/draft-06/schema":
		return draft6
	case "http://json-schema.org/draft-07/schema":
		return draft7
	case "https://json-schema.org/draft/2019-09/schema":
		return draft2019
	}
	return draft2020
}

// unenforced lists the validation keywords llguidance (1.9.1, src/json/schema.rs) does not
// implement, with the first draft that defines each. llguidance refuses a schema using one
// of them (in its default, non-lenient mode) and ignores keywords its draft does not define,
// as the JSON Schema specification says to. Dropping any of them would let through values
// the schema forbids, so CheckSchema refuses them by name.
var unenforced = map[string]draft{
	"not":                   draft4,
	"dependencies":          draft4,
	"uniqueItems":           draft4, // false (no constraint) is accepted and dropped
	"contains":              draft6,
	"propertyNames":         draft6,
	"if":                    draft7,
	"then":                  draft7,
	"else":                  draft7,
	"dependentRequired":     draft2019,
	"dependentSchemas":      draft2019,
	"minContains":           draft2019,
	"maxContains":           draft2019,
	"unevaluatedItems":      draft2019,
	"unevaluatedProperties": draft2019,
	"$recursiveRef":         draft2019,
	"$recursiveAnchor":      draft2019,
	"$dynamicRef":           draft2020,
	"$dynamicAnchor":        draft2020,
}

// knownFormats are the string formats llguidance enforces. Others are annotations
// (JSON Schema 2019-09 and later make "format" an annotation unless a validator opts in):
// the grammars drop them, where llguidance would refuse the schema.
var knownFormats = map[string]bool{
	"date-time": true, "time": true, "date": true, "duration": true, "email": true,
	"hostname": true, "ipv4": true, "ipv6": true, "uuid": true, "uri": true, "unknown": true,
}

var jsonTypes = map[string]bool{
	"null": true, "boolean": true, "integer": true, "number": true, "string": true, "array": true, "object": true,
}

// CheckSchema checks a JSON Schema before generation. It must be a JSON object or true (nil
// or empty input means no schema and is accepted: Answer then allows any JSON object). It
// refuses, as a *SchemaError naming the keyword and where it is:
//
//   - keywords llguidance cannot enforce (see unenforced), in the schema or in any
//     definition it reaches through $ref;
//   - malformed keyword values llguidance would refuse (a "type" that is no JSON type,
//     "required" that is not a list of names, a negative "minItems", an empty "anyOf", …);
//   - a $ref that does not resolve within the document: refs must be "#", a JSON pointer
//     "#/…" (as "#/$defs/name" or "#/definitions/name") or a "#name" $anchor;
//   - a recursive $ref with other keywords beside it ("type", "nullable", …; annotations
//     such as "description" are fine): llguidance cannot combine a schema with one it is
//     still compiling;
//   - recursion with no way out: a schema, reached through $ref, none of whose values is
//     finite (an object that requires a property whose schema is the object itself, or refs
//     that lead only to each other). llguidance would compile these into a grammar that never
//     ends or allows nothing. Recursion through an optional property, an array that may be
//     empty or an anyOf branch that ends is fine.
//
// It does not refuse schemas for breaking OpenAI's strict-mode rules (every property
// required, additionalProperties false, …): only what cannot be enforced is refused.
// patternProperties is enforced by llguidance 1.9.1 (with patterns that do not overlap; it
// reports overlapping ones itself), and so is accepted. Errors that need llguidance's own
// compiler to find (an invalid regular expression, overlapping patternProperties, a schema
// no value satisfies) are left to grammar validation.
func CheckSchema(schema json.RawMessage) error {
	if len(strings.TrimSpace(string(schema))) == 0 {
		return nil
	}
	root, err := parseJSON(schema)
	if err != nil {
		return &SchemaError{Msg: "not valid JSON: " + err.Error()}
	}
	switch {
	case root.kind == kBool && root.truth:
		return nil
	case root.kind == kBool:
		return &SchemaError{Msg: "the schema false allows no value"}
	case root.kind != kObject:
		return &SchemaError{Msg: "a schema must be a JSON object (or true)"}
	}
	c := newChecker(root)
	if err := c.visit(root, nil); err != nil {
		return err
	}
	if err := c.checkRefSiblings(); err != nil {
		return err
	}
	return c.checkTermination()
}

// checker walks the schema positions reachable from the root, following $ref.
type checker struct {
	root    *value
	draft   draft
	anchors map[string]*value   // $anchor name → schema
	paths   map[*value][]string // where each schema object sits (first seen)
	order   []*value            // visited schema objects, in visiting order
	refs    map[*value]*value   // schema object with $ref → its target
	visited map[*value]bool
}

func newChecker(root *value) *checker {
	c := &checker{
		root: root, draft: detectDraft(root), anchors: map[string]*value{},
		paths: map[*value][]string{}, refs: map[*value]*value{}, visited: map[*value]bool{},
	}
	// Anchors and locations of every schema in the document, reachable or not, so a $ref
	// into a definition reports the definition's own path.
	eachSchema(root, nil, true, func(s *value, path []string) {
		if _, seen := c.paths[s]; !seen {
			c.paths[s] = path
		}
		if a := s.get("$anchor"); a != nil && a.kind == kString {
			if _, dup := c.anchors[a.str]; !dup {
				c.anchors[a.str] = s
			}
		}
	})
	return c
}

func joinPath(path []string) string { return strings.Join(path, ".") }

func appendPath(path []string, segs ...string) []string {
	return append(append(make([]string, 0, len(path)+len(segs)), path...), segs...)
}

// eachSchema calls fn on every schema object at or below s (s included) in pre-order:
// the subschema positions of the keywords CheckSchema knows, and with defs also $defs and
// definitions. Values of enum, const, default, examples and unknown keywords are data, not
// schemas, and are not entered.
func eachSchema(s *value, path []string, defs bool, fn func(s *value, path []string)) {
	if !s.isObject() {
		return
	}
	fn(s, path)
	forSubschemas(s, defs, func(sub *value, segs ...string) {
		eachSchema(sub, appendPath(path, segs...), defs, fn)
	})
}

// forSubschemas calls fn on each direct subschema of the schema object s with the path
// segments leading to it.
func forSubschemas(s *value, defs bool, fn func(sub *value, segs ...string)) {
	for i, k := range s.keys {
		v := s.vals[i]
		switch k {
		case "properties", "patternProperties", "dependentSchemas":
			if v.kind == kObject {
				for j, name := range v.keys {
					fn(v.vals[j], k, name)
				}
			}
		case "$defs", "definitions":
			if defs && v.kind == kObject {
				for j, name := range v.keys {
					fn(v.vals[j], k, name)
				}
			}
		case "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
			"propertyNames", "unevaluatedItems", "unevaluatedProperties":
			fn(v, k)
		case "items":
			if v.kind == kArray {
				for j, e := range v.vals {
					fn(e, k, strconv.Itoa(j))
				}
			} else {
				fn(v, k)
			}
		case "allOf", "anyOf", "oneOf", "prefixItems":
			if v.kind == kArray {
				for j, e := range v.vals {
					fn(e, k, strconv.Itoa(j))
				}
			}
		}
	}
}

func isSchema(v *value) bool { return v != nil && (v.kind == kObject || v.kind == kBool) }

func (c *checker) visit(s *value, path []string) error {
	if !s.isObject() || c.visited[s] {
		return nil
	}
	c.visited[s] = true
	c.order = append(c.order, s)
	if _, seen := c.paths[s]; !seen {
		c.paths[s] = path
	}
	fail := func(keyword, format string, args ...any) error {
		return &SchemaError{Path: joinPath(path), Keyword: keyword, Msg: fmt.Sprintf(format, args...)}
	}
	for i, k := range s.keys {
		v := s.vals[i]
		if since, ok := unenforced[k]; ok && c.draft >= since {
			if k == "uniqueItems" && v.kind == kBool && !v.truth {
				continue
			}
			return fail(k, "%s is not supported in constrained generation", k)
		}
		if err := c.checkKeyword(k, v, fail); err != nil {
			return err
		}
	}
	if r := s.get("$ref"); r != nil {
		target, tpath, err := c.resolve(r.str)
		if err != nil {
			return fail("$ref", "%s", err)
		}
		c.refs[s] = target
		if err := c.visit(target, tpath); err != nil {
			return err
		}
	}
	var err error
	forSubschemas(s, false, func(sub *value, segs ...string) {
		if err == nil {
			err = c.visit(sub, appendPath(path, segs...))
		}
	})
	return err
}

// checkKeyword refuses keyword values llguidance cannot compile.
func (c *checker) checkKeyword(k string, v *value, fail func(string, string, ...any) error) error {
	switch k {
	case "type":
		types := []*value{v}
		if v.kind == kArray {
			if len(v.vals) == 0 {
				return fail(k, "an empty list of types allows no value")
			}
			types = v.vals
		}
		for _, t := range types {
			if t.kind != kString || !jsonTypes[t.str] {
				return fail(k, "%s is not a JSON Schema type", t.encode())
			}
		}
	case "required":
		if v.kind != kArray {
			return fail(k, "must be a list of property names")
		}
		for _, e := range v.vals {
			if e.kind != kString {
				return fail(k, "must be a list of property names, not %s", e.encode())
			}
		}
	case "enum":
		if v.kind != kArray || len(v.vals) == 0 {
			return fail(k, "must be a non-empty list of values")
		}
	case "properties", "patternProperties", "$defs", "definitions":
		if v.kind != kObject {
			return fail(k, "must be an object of schemas")
		}
		for j, e := range v.vals {
			if !isSchema(e) {
				return fail(k, "%q is not a schema (an object or a boolean)", v.keys[j])
			}
		}
	case "additionalProperties", "additionalItems":
		if !isSchema(v) {
			return fail(k, "must be a schema (an object or a boolean)")
		}
	case "items":
		if v.kind == kArray {
			for _, e := range v.vals {
				if !isSchema(e) {
					return fail(k, "must hold schemas (objects or booleans)")
				}
			}
		} else if !isSchema(v) {
			return fail(k, "must be a schema (an object or a boolean)")
		}
	case "allOf", "anyOf", "oneOf", "prefixItems":
		if v.kind != kArray || (k != "prefixItems" && len(v.vals) == 0) {
			return fail(k, "must be a non-empty list of schemas")
		}
		for _, e := range v.vals {
			if !isSchema(e) {
				return fail(k, "must hold schemas (objects or booleans)")
			}
		}
	case "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties":
		if v.kind != kNumber {
			return fail(k, "must be a non-negative integer")
		}
		if _, err := strconv.ParseUint(v.num, 10, 64); err != nil {
			return fail(k, "must be a non-negative integer, not %s", v.num)
		}
	case "minimum", "maximum":
		if v.kind != kNumber {
			return fail(k, "must be a number")
		}
	case "exclusiveMinimum", "exclusiveMaximum":
		if v.kind != kNumber && v.kind != kBool {
			return fail(k, "must be a number")
		}
	case "multipleOf":
		if f, err := strconv.ParseFloat(v.num, 64); v.kind != kNumber || err != nil || f <= 0 {
			return fail(k, "must be a positive number")
		}
	case "pattern", "format":
		if v.kind != kString {
			return fail(k, "must be a string")
		}
	case "$ref":
		if v.kind != kString {
			return fail(k, "must be a string")
		}
	}
	return nil
}

// resolve finds a $ref's target in the document.
func (c *checker) resolve(ref string) (*value, []string, error) {
	if !strings.HasPrefix(ref, "#") {
		return nil, nil, fmt.Errorf("%q refers outside the schema; only refs within it (\"#/$defs/name\") are supported", ref)
	}
	frag := ref[1:]
	if frag != "" && !strings.HasPrefix(frag, "/") {
		if s, ok := c.anchors[frag]; ok {
			return s, c.paths[s], nil
		}
		return nil, nil, fmt.Errorf("%q names no $anchor in the schema", ref)
	}
	target, segs, err := pointer(c.root, frag)
	if err != nil {
		return nil, nil, fmt.Errorf("%q does not resolve: %v", ref, err)
	}
	if !isSchema(target) {
		return nil, nil, fmt.Errorf("%q points to %s, not a schema", ref, target.encode())
	}
	return target, segs, nil
}

// pointer follows a JSON pointer (a URI fragment: percent-encoded, ~0 and ~1 escaped) from
// root and returns the value and the unescaped segments.
func pointer(root *value, frag string) (*value, []string, error) {
	if frag == "" || frag == "/" {
		return root, nil, nil
	}
	cur := root
	var segs []string
	for _, raw := range strings.Split(frag[1:], "/") {
		seg, err := url.PathUnescape(raw)
		if err != nil {
			return nil, nil, err
		}
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		segs = append(segs, seg)
		switch cur.kind {
		case kObject:
			next := cur.get(seg)
			if next == nil {
				return nil, nil, fmt.Errorf("no %q in %s", seg, where(segs[:len(segs)-1]))
			}
			cur = next
		case kArray:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(cur.vals) {
				return nil, nil, fmt.Errorf("no element %q in %s", seg, where(segs[:len(segs)-1]))
			}
			cur = cur.vals[i]
		default:
			return nil, nil, fmt.Errorf("%s is not an object", where(segs[:len(segs)-1]))
		}
	}
	return cur, segs, nil
}

func where(segs []string) string {
	if len(segs) == 0 {
		return "the root"
	}
	return joinPath(segs)
}

// checkTermination finds schemas none of whose values is finite. finite[s] is the least
// fixed point of "s allows some finite value, counting a contradiction (false, an
// impossible combination) as fine": contradictions are llguidance's to handle (it drops
// those branches), while a value that can only go on forever would let the model write
// until max_tokens. Since only $ref makes a schema reach itself, a schema that is not
// finite has a $ref on its way to itself, and the error names the first such $ref.
func (c *checker) checkTermination() error {
	finite := map[*value]bool{}
	ok := func(s *value) bool { return s == nil || s.kind != kObject || finite[s] }
	for changed := true; changed; {
		changed = false
		for _, s := range c.order {
			if !finite[s] && c.allowsFinite(s, ok) {
				finite[s] = true
				changed = true
			}
		}
	}
	for _, s := range c.order {
		if t, isRef := c.refs[s]; isRef && !finite[s] {
			return &SchemaError{Path: joinPath(c.paths[s]), Keyword: "$ref",
				Msg: fmt.Sprintf("recursion with no way out: %s allows no finite value (each one must contain another)",
					where(c.paths[t]))}
		}
	}
	return nil
}

// allowsFinite reports whether s allows a finite value, given which subschemas do (ok).
func (c *checker) allowsFinite(s *value, ok func(*value) bool) bool {
	if t, isRef := c.refs[s]; isRef && !ok(t) {
		return false
	}
	if all := s.get("allOf"); all != nil {
		for _, b := range all.vals {
			if !ok(b) {
				return false
			}
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches := s.get(k); branches != nil && len(branches.vals) > 0 {
			any := false
			for _, b := range branches.vals {
				any = any || ok(b)
			}
			if !any {
				return false
			}
		}
	}
	if s.get("enum") != nil || s.get("const") != nil {
		return true // literal values are finite
	}
	for _, t := range schemaTypes(s) {
		switch t {
		case "object":
			if c.objectFinite(s, ok) {
				return true
			}
		case "array":
			if c.arrayFinite(s, ok) {
				return true
			}
		default:
			return true
		}
	}
	return false
}

// schemaTypes is the types s's "type" allows (all of them when absent).
func schemaTypes(s *value) []string {
	t := s.get("type")
	switch {
	case t == nil:
		return []string{"null", "boolean", "number", "string", "array", "object"}
	case t.kind == kString:
		return []string{t.str}
	case t.kind == kArray:
		var out []string
		for _, e := range t.vals {
			out = append(out, e.str)
		}
		return out
	}
	return nil
}

func (c *checker) objectFinite(s *value, ok func(*value) bool) bool {
	req := s.get("required")
	if req == nil {
		return true
	}
	props := s.get("properties")
	for _, r := range req.vals {
		if p := props.get(r.str); p != nil {
			if !ok(p) {
				return false
			}
		} else if s.get("patternProperties") == nil {
			if !ok(s.get("additionalProperties")) {
				return false
			}
		}
	}
	return true
}

func (c *checker) arrayFinite(s *value, ok func(*value) bool) bool {
	n := 0
	if m := s.get("minItems"); m != nil {
		v, _ := strconv.ParseUint(m.num, 10, 64)
		n = int(min(v, 1<<20))
	}
	prefix := s.get("prefixItems")
	items := s.get("items")
	if items != nil && items.kind == kArray {
		prefix, items = items, s.get("additionalItems")
	}
	for i := 0; i < n; i++ {
		var item *value
		if prefix != nil && i < len(prefix.vals) {
			item = prefix.vals[i]
		} else {
			item = items
		}
		if !ok(item) {
			return false
		}
		if prefix == nil || i >= len(prefix.vals) {
			break // the rest use the same schema
		}
	}
	return true
}

// annotations are the keywords llguidance ignores beside a $ref (src/json/schema.rs,
// META_AND_ANNOTATIONS).
var annotations = map[string]bool{
	"$ref": true, "$anchor": true, "$defs": true, "definitions": true, "$schema": true, "$id": true,
	"id": true, "$comment": true, "title": true, "description": true, "default": true,
	"readOnly": true, "writeOnly": true, "examples": true, "contentMediaType": true,
	"contentEncoding": true,
}

// checkRefSiblings refuses a $ref with other keywords beside it when the schema it refers
// to reaches back to it: llguidance intersects such a $ref with its siblings, which needs
// the referenced schema compiled, and it is still being compiled.
func (c *checker) checkRefSiblings() error {
	for _, s := range c.order {
		target, isRef := c.refs[s]
		if !isRef {
			continue
		}
		var siblings []string
		for _, k := range s.keys {
			if !annotations[k] {
				siblings = append(siblings, k)
			}
		}
		if len(siblings) > 0 && c.reaches(target, s) {
			return &SchemaError{Path: joinPath(c.paths[s]), Keyword: "$ref",
				Msg: fmt.Sprintf("a recursive $ref cannot have other keywords beside it (%s): move them into the schema it refers to",
					strings.Join(siblings, ", "))}
		}
	}
	return nil
}

// reaches reports whether the schema object to is from, or below it through subschemas
// and $refs.
func (c *checker) reaches(from, to *value) bool {
	seen := map[*value]bool{}
	stack := []*value{from}
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !s.isObject() || seen[s] {
			continue
		}
		if s == to {
			return true
		}
		seen[s] = true
		if t, ok := c.refs[s]; ok {
			stack = append(stack, t)
		}
		forSubschemas(s, false, func(sub *value, _ ...string) { stack = append(stack, sub) })
	}
	return false
}

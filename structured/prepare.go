package structured

import "strings"

// normalize rewrites a schema (in place) into what llguidance enforces as the schema
// means: it drops "format" values llguidance does not know (annotations, see knownFormats;
// llguidance would refuse the schema) and "uniqueItems": false (no constraint; llguidance
// refuses the keyword whatever its value). Every schema position is visited, definitions
// included.
func normalize(root *value) {
	eachSchema(root, nil, true, func(s *value, _ []string) {
		if f := s.get("format"); f != nil && f.kind == kString && !knownFormats[f.str] {
			s.del("format")
		}
		if u := s.get("uniqueItems"); u != nil && u.kind == kBool && !u.truth {
			s.del("uniqueItems")
		}
	})
}

// embeddedRoot is the $defs name under which embed keeps the schema a subschema came from.
const embeddedRoot = "dflash_root"

// embed makes sub, a subschema of root, a document of its own for %json. A subschema may
// use $ref into its root ("#/$defs/x", or "#" itself); the document then carries the whole
// root under $defs/dflash_root and every ref, in sub and in that copy, is rewritten to
// point into the copy ("#/$defs/x" → "#/$defs/dflash_root/$defs/x"). The copy drops its
// $id, which would otherwise make it a resource of its own with refs resolving against it.
// "#name" anchor refs are left as they are: anchors resolve anywhere in the document.
func embed(root, sub *value) *value {
	doc := sub.clone()
	if !hasLocalRef(doc) {
		return doc
	}
	rebase(doc)
	base := root.clone()
	base.del("$id")
	rebase(base)
	defs := doc.get("$defs")
	if !defs.isObject() {
		defs = &value{kind: kObject}
		doc.set("$defs", defs)
	}
	defs.set(embeddedRoot, base)
	if s := root.get("$schema"); s != nil && doc.get("$schema") == nil {
		doc.set("$schema", s.clone())
	}
	return doc
}

func isLocalPointerRef(ref string) bool { return ref == "#" || strings.HasPrefix(ref, "#/") }

func hasLocalRef(s *value) bool {
	found := false
	eachSchema(s, nil, true, func(n *value, _ []string) {
		if r := n.get("$ref"); r != nil && r.kind == kString && isLocalPointerRef(r.str) {
			found = true
		}
	})
	return found
}

// rebase points every local pointer ref in s into $defs/dflash_root.
func rebase(s *value) {
	eachSchema(s, nil, true, func(n *value, _ []string) {
		if r := n.get("$ref"); r != nil && r.kind == kString && isLocalPointerRef(r.str) {
			frag := strings.TrimPrefix(strings.TrimPrefix(r.str, "#"), "/")
			ref := "#/$defs/" + embeddedRoot
			if frag != "" {
				ref += "/" + frag
			}
			n.set("$ref", strValue(ref))
		}
	})
}

// toolJSONOptions are llguidance's JSON options for JSON inside tool calls: no free
// whitespace, and the separators Python's json.dumps writes, which is how Qwen's chat
// templates render tool-call arguments (the tojson filter) and so how the models write them.
func toolJSONOptions() *value {
	return objValue(
		"whitespace_flexible", &value{kind: kBool},
		"item_separator", strValue(", "),
		"key_separator", strValue(": "),
	)
}

// withOptions returns doc (a schema object, or true; callers leave out false schemas) as an
// object carrying llguidance's JSON options under "x-guidance", which llguidance reads from
// the top of a %json document.
func withOptions(doc, opts *value) *value {
	if !doc.isObject() {
		doc = &value{kind: kObject}
	}
	out := &value{kind: kObject}
	out.set("x-guidance", opts)
	for i, k := range doc.keys {
		if k != "x-guidance" {
			out.set(k, doc.vals[i])
		}
	}
	return out
}

// protectStrings keeps the words (tool-call markup) out of the strings of a JSON document
// written inside a tool call, where the server's parser would take them for the end of
// the call: every schema typed as a string (by "type", or by string keywords without one)
// gets a pattern excluding them. Schemas that already fix their strings (pattern, enum,
// const) are left as they are, and so are strings the schema does not type (object keys,
// values of untyped or additional properties): those are left to the model.
func protectStrings(doc *value, words []string) {
	pattern := strValue(withoutWords(words))
	eachSchema(doc, nil, true, func(s *value, _ []string) {
		for _, k := range []string{"$ref", "enum", "const", "pattern"} {
			if s.get(k) != nil {
				return
			}
		}
		typed := s.get("type") != nil && kindsOfTypes(s)&kindString != 0
		untypedString := s.get("type") == nil &&
			(s.get("minLength") != nil || s.get("maxLength") != nil || s.get("format") != nil)
		if typed || untypedString {
			s.set("pattern", pattern)
		}
	})
}

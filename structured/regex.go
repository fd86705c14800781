package structured

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
)

// anyText is a Lark/Rust regex for any text, newlines included.
const anyText = `(?s:.*)`

// larkString is s as a Lark string literal (Lark takes JSON string syntax).
func larkString(s string) string { return quoteJSON(s) }

// larkRegex is the Rust-syntax regex re as a Lark regex literal /…/. A slash cannot appear
// raw between the delimiters, so it is written \x2F (also where re escaped it as \/), and
// raw control characters are written as escapes so the literal stays on one line.
func larkRegex(re string) string {
	var b strings.Builder
	b.WriteByte('/')
	for i := 0; i < len(re); {
		c := re[i]
		switch {
		case c == '\\' && i+1 < len(re):
			if re[i+1] == '/' {
				b.WriteString(`\x2F`)
			} else {
				r, size := utf8.DecodeRuneInString(re[i+1:])
				if r < 0x20 || r == 0x7f {
					fmt.Fprintf(&b, `\x{%x}`, r) // an escaped raw control character: the character itself
				} else {
					b.WriteByte('\\')
					b.WriteString(re[i+1 : i+1+size])
				}
				i += 1 + size
				continue
			}
			i += 2
			continue
		case c == '/':
			b.WriteString(`\x2F`)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, `\x{%x}`, c)
		default:
			b.WriteByte(c)
		}
		i++
	}
	b.WriteByte('/')
	return b.String()
}

// containsAny is a regex matching any text that contains one of the words.
func containsAny(words []string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = regexp.QuoteMeta(w)
	}
	return anyText + "(?:" + strings.Join(quoted, "|") + ")" + anyText
}

// searchRegex turns a JSON Schema "pattern" into a regex that matches the whole of every
// string the pattern accepts. JSON Schema patterns are unanchored (they match anywhere in
// the string, as llguidance treats them), while a Lark regex must match the whole lexeme:
// the pattern is wrapped in .* on each side it is not anchored at by ^ or $. The pattern is
// read with Go's regexp/syntax (Perl flags: \d, \w and \s are ASCII, as in ECMA-262 and as
// llguidance reads them) and written back in the syntax llguidance's Rust regex parser
// reads; a pattern Go cannot read is wrapped as it is, and llguidance judges it.
func searchRegex(pattern string) string {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		start := strings.HasPrefix(pattern, "^")
		body := strings.TrimPrefix(pattern, "^")
		end := strings.HasSuffix(body, "$") && !escapedAt(body, len(body)-1)
		if end {
			body = body[:len(body)-1]
		}
		return wrapSearch("(?:"+body+")", start, end)
	}
	branches := []*syntax.Regexp{re}
	if re.Op == syntax.OpAlternate {
		branches = re.Sub
	}
	parts := make([]string, len(branches))
	for i, br := range branches {
		body, start, end := trimAnchors(br)
		parts[i] = wrapSearch("(?:"+body.String()+")", start, end)
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "(?:" + strings.Join(parts, "|") + ")"
}

func wrapSearch(body string, start, end bool) string {
	if !start {
		body = anyText + body
	}
	if !end {
		body += anyText
	}
	return body
}

// escapedAt reports whether s[i] is escaped by an odd run of backslashes before it.
func escapedAt(s string, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

func isStartAnchor(re *syntax.Regexp) bool {
	return re.Op == syntax.OpBeginText || re.Op == syntax.OpBeginLine
}

func isEndAnchor(re *syntax.Regexp) bool {
	return re.Op == syntax.OpEndText || re.Op == syntax.OpEndLine
}

// trimAnchors removes the ^ and $ at the edges of one alternative and says which it had.
func trimAnchors(re *syntax.Regexp) (body *syntax.Regexp, start, end bool) {
	switch {
	case isStartAnchor(re):
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true, false
	case isEndAnchor(re):
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}, false, true
	case re.Op != syntax.OpConcat:
		return re, false, false
	}
	subs := re.Sub
	for len(subs) > 0 && isStartAnchor(subs[0]) {
		subs, start = subs[1:], true
	}
	for len(subs) > 0 && isEndAnchor(subs[len(subs)-1]) {
		subs, end = subs[:len(subs)-1], true
	}
	switch len(subs) {
	case 0:
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}, start, end
	case 1:
		return subs[0], start, end
	}
	c := *re
	c.Sub = subs
	return &c, start, end
}

// formatRegex is a regex for the strings of a "format", for values written as raw text
// (the qwen3_coder format); "" for formats it does not cover, which raw text then treats
// as annotations. JSON values leave formats to llguidance.
func formatRegex(format string) string {
	const (
		date = `[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])`
		time = `(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])`
		hex  = `[0-9a-fA-F]`
		oct  = `(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])`
	)
	switch format {
	case "date":
		return date
	case "time":
		return time
	case "date-time":
		return date + `[tT]` + time
	case "uuid":
		return hex + `{8}-` + hex + `{4}-` + hex + `{4}-` + hex + `{4}-` + hex + `{12}`
	case "ipv4":
		return oct + `(?:\.` + oct + `){3}`
	}
	return ""
}

// withoutWords is a regex (ECMA-262 and Rust syntax alike, anchored with ^ and $) for the
// strings that contain none of words, for a JSON Schema "pattern", which has no complement
// operator. Each word must start with '<' and contain no other '<' (true of the tool-call
// markup), so a partial match can only restart at a '<': the strings are runs of non-'<'
// characters and of '<' followed by a proper prefix of a word's rest (after '<') that the
// next character leaves, where a '<' may also cut such a prefix short.
func withoutWords(words []string) string {
	type node struct {
		next map[byte]*node
		end  bool
	}
	root := &node{next: map[byte]*node{}}
	for _, w := range words {
		if w == "" || w[0] != '<' || strings.Contains(w[1:], "<") {
			panic("withoutWords: " + w + " must start with '<' and have no other '<'")
		}
		n := root
		for i := 1; i < len(w); i++ {
			c := n.next[w[i]]
			if c == nil {
				c = &node{next: map[byte]*node{}}
				n.next[w[i]] = c
			}
			n = c
		}
		n.end = true
	}
	lit := func(c byte) string { return regexp.QuoteMeta(string(c)) }
	classLit := func(c byte) string {
		if strings.IndexByte(`\]^-[`, c) >= 0 {
			return `\` + string(c)
		}
		return string(c)
	}
	sorted := func(n *node) []byte {
		var cs []byte
		for c := range n.next {
			cs = append(cs, c)
		}
		slices.Sort(cs)
		return cs
	}
	// prefix: the proper prefixes from n on (any may stop here); leave: a proper prefix
	// from n on, then a character that continues no word and is not '<'.
	var prefix, leave func(n *node) string
	prefix = func(n *node) string {
		var alts []string
		for _, c := range sorted(n) {
			if ch := n.next[c]; !ch.end {
				alts = append(alts, lit(c)+prefix(ch))
			}
		}
		if len(alts) == 0 {
			return ""
		}
		return "(?:" + strings.Join(alts, "|") + ")?"
	}
	leave = func(n *node) string {
		class := "[^<"
		for _, c := range sorted(n) {
			class += classLit(c)
		}
		alts := []string{class + "]"}
		for _, c := range sorted(n) {
			if ch := n.next[c]; !ch.end {
				alts = append(alts, lit(c)+leave(ch))
			}
		}
		return "(?:" + strings.Join(alts, "|") + ")"
	}
	cut := "(?:<" + prefix(root) + ")*"
	return "^(?:[^<]|" + cut + "<" + leave(root) + ")*" + cut + "$"
}

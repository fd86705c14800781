package hub

import (
	"regexp"
	"strings"
	"sync"
)

// DefaultAllowPatterns select what a model needs: configs, weights, tokenizer files and chat
// templates; not READMEs, images or framework checkpoints in other formats.
var DefaultAllowPatterns = []string{
	"*.json",
	"*.safetensors",
	"tokenizer.model",
	"tiktoken.model",
	"*.tiktoken",
	"*.txt",
	"*.jinja",
}

// Match reports whether a repository path matches an allow pattern the way huggingface_hub's
// allow_patterns do (Python's fnmatch on the whole path): '*' matches any run of characters
// including '/', '?' one character, '[...]' and '[!...]' a set; a pattern ending in '/' selects
// everything under that folder.
func Match(pattern, repoPath string) bool {
	return compilePattern(pattern).MatchString(repoPath)
}

func matchAny(patterns []string, repoPath string) bool {
	for _, p := range patterns {
		if Match(p, repoPath) {
			return true
		}
	}
	return false
}

var patternCache sync.Map // pattern -> *regexp.Regexp

func compilePattern(pattern string) *regexp.Regexp {
	if re, ok := patternCache.Load(pattern); ok {
		return re.(*regexp.Regexp)
	}
	re, err := regexp.Compile(translateGlob(pattern))
	if err != nil {
		// Only a set with a reversed range ("[z-a]") gets here; such a set matches nothing in
		// fnmatch either, and matching the pattern literally is as close as a pattern can get.
		re = regexp.MustCompile(`^` + regexp.QuoteMeta(pattern) + `$`)
	}
	patternCache.Store(pattern, re)
	return re
}

// translateGlob turns an fnmatch pattern into an anchored regular expression. Every character is
// a wildcard, a set member or quoted.
func translateGlob(pattern string) string {
	pattern = strings.ReplaceAll(pattern, "\\", "/")
	if strings.HasSuffix(pattern, "/") {
		pattern += "*"
	}
	var b strings.Builder
	b.WriteString(`(?s)^`)
	rs := []rune(pattern)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; r {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		case '[':
			class, next, ok := globClass(rs, i)
			if !ok {
				b.WriteString(`\[`)
				continue
			}
			b.WriteString(class)
			i = next
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`$`)
	return b.String()
}

// globClass translates the set starting at rs[open] ('[') and returns the index of its closing
// ']'. As in fnmatch, a ']' right after '[' or '[!' is a member, and an unclosed '[' is literal.
func globClass(rs []rune, open int) (class string, closing int, ok bool) {
	j := open + 1
	negate := j < len(rs) && rs[j] == '!'
	if negate {
		j++
	}
	start := j
	if j < len(rs) && rs[j] == ']' {
		j++
	}
	for j < len(rs) && rs[j] != ']' {
		j++
	}
	if j >= len(rs) {
		return "", 0, false
	}
	var b strings.Builder
	b.WriteString("[")
	if negate {
		b.WriteString("^")
	}
	for _, r := range rs[start:j] {
		switch r {
		case '\\', '[', ']', '^':
			b.WriteRune('\\')
		}
		b.WriteRune(r)
	}
	b.WriteString("]")
	return b.String(), j, true
}

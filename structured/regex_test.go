package structured

import (
	"math/rand"
	"regexp"
	"strings"
	"testing"
)

// withoutWords matches exactly the strings that contain none of the words, checked on
// random strings built from pieces of the markup.
func TestWithoutWords(t *testing.T) {
	pieces := []string{"<", "/", "p", "parameter", "</parameter", ">", "=", "a", "\n", "</", "<<", "function",
		"tool_call", "é", "</tool_call", "<parameter", "]", "-", "^"}
	for _, words := range [][]string{coderMarkers, {"</tool_call>"}} {
		pattern := withoutWords(words)
		re := regexp.MustCompile(pattern)
		rng := rand.New(rand.NewSource(1))
		for i := 0; i < 100000; i++ {
			var b strings.Builder
			for j := rng.Intn(8); j > 0; j-- {
				b.WriteString(pieces[rng.Intn(len(pieces))])
			}
			s := b.String()
			want := true
			for _, w := range words {
				want = want && !strings.Contains(s, w)
			}
			if got := re.MatchString(s); got != want {
				t.Fatalf("words %q: %q matches %v, want %v", words, s, got, want)
			}
		}
	}
}

// searchRegex matches the whole of exactly the strings the JSON Schema pattern finds a
// match in (checked with Go's regexp, which reads both the same way here).
func TestSearchRegex(t *testing.T) {
	patterns := []string{`^[a-z]+$`, `[0-9]`, `^ab`, `cd$`, `a|^b`, `^a|b$`, `(?i)^abc$`, `\d{3}`, ``, `^$`, `x\$`, `^(a|b)c$`}
	inputs := []string{"", "a", "b", "ab", "abc", "ABC", "xab", "abx", "cd", "xcd", "cdx", "123", "12", "x$", "ac", "bc", "xbc", "a\nb", "Ab", "ba"}
	for _, p := range patterns {
		want := regexp.MustCompile(p)
		got := regexp.MustCompile(`^(?:` + searchRegex(p) + `)$`)
		for _, s := range inputs {
			if got.MatchString(s) != want.MatchString(s) {
				t.Errorf("pattern %q (as %q) on %q: %v, want %v", p, searchRegex(p), s, got.MatchString(s), want.MatchString(s))
			}
		}
	}
}

func TestLarkRegex(t *testing.T) {
	tests := []struct{ re, want string }{
		{`a/b`, `/a\x2Fb/`},
		{`a\/b`, `/a\x2Fb/`},
		{`a\\/b`, `/a\\\x2Fb/`},
		{"a\nb", `/a\x{a}b/`},
		{`[^/]+`, `/[^\x2F]+/`},
		{`\d\.`, `/\d\./`},
	}
	for _, tt := range tests {
		if got := larkRegex(tt.re); got != tt.want {
			t.Errorf("larkRegex(%q) = %s, want %s", tt.re, got, tt.want)
		}
	}
}

func TestFormatRegex(t *testing.T) {
	tests := []struct {
		format      string
		good, wrong []string
	}{
		{"date", []string{"2024-02-29", "1999-12-31"}, []string{"2024-13-01", "24-01-01", "2024-1-1"}},
		{"time", []string{"23:59:60Z", "08:00:00.5+02:00"}, []string{"24:00:00Z", "08:00:00"}},
		{"date-time", []string{"2024-02-29T08:00:00Z"}, []string{"2024-02-29 08:00:00Z", "2024-02-29"}},
		{"uuid", []string{"123e4567-e89b-12d3-a456-426614174000"}, []string{"123e4567e89b12d3a456426614174000"}},
		{"ipv4", []string{"192.168.0.1", "0.0.0.0"}, []string{"256.1.1.1", "1.2.3"}},
	}
	for _, tt := range tests {
		re := regexp.MustCompile(`^(?:` + formatRegex(tt.format) + `)$`)
		for _, s := range tt.good {
			if !re.MatchString(s) {
				t.Errorf("%s: %q refused", tt.format, s)
			}
		}
		for _, s := range tt.wrong {
			if re.MatchString(s) {
				t.Errorf("%s: %q accepted", tt.format, s)
			}
		}
	}
	if formatRegex("email") != "" {
		t.Error("email has a regex; the raw-text formats are date, time, date-time, uuid and ipv4")
	}
}

func TestJSONTreeKeepsOrder(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b": 1, "a": [1.50, true, null, "x<y&z"], "c": {"z": {}, "y": []}}`, `{"b":1,"a":[1.50,true,null,"x<y&z"],"c":{"z":{},"y":[]}}`},
		{`{"a": 1, "b": 2, "a": 3}`, `{"a":3,"b":2}`},
		{`"tab\there \u007f \u0001"`, `"tab\there \u007f \u0001"`},
		{`1e400`, `1e400`},
	}
	for _, tt := range tests {
		v, err := parseJSON([]byte(tt.in))
		if err != nil {
			t.Fatalf("%s: %v", tt.in, err)
		}
		if got := v.encode(); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.in, got, tt.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a": 1} x`, `[1,]`} {
		if _, err := parseJSON([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

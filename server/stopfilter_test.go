package server

import (
	"strings"
	"testing"
)

func TestStopFilterCutsAtFirstStopAcrossDeltas(t *testing.T) {
	tests := []struct {
		name    string
		stops   []string
		deltas  []string
		want    string
		matched bool
	}{
		{"no stops passes everything", nil, []string{"ab", "cd"}, "abcd", false},
		{"stop inside one delta", []string{"END"}, []string{"abcENDdef"}, "abc", true},
		{"stop spanning two deltas", []string{"END"}, []string{"abcE", "NDdef"}, "abc", true},
		{"stop spanning three deltas", []string{"STOP"}, []string{"xS", "T", "OPy"}, "x", true},
		{"partial match that does not complete is flushed", []string{"END"}, []string{"abcEN", "x"}, "abcENx", false},
		{"partial match at the very end is flushed", []string{"END"}, []string{"abcEN"}, "abcEN", false},
		{"earliest of several stops wins", []string{"zz", "b"}, []string{"azzb"}, "a", true},
		{"stop at the start gives nothing", []string{"ab"}, []string{"abc"}, "", true},
		{"later deltas are dropped", []string{"X"}, []string{"aX", "more text"}, "a", true},
		{"multibyte stop split inside a rune boundary", []string{"é!"}, []string{"caf", "é", "!tail"}, "caf", true},
		{"overlapping prefix", []string{"aab"}, []string{"a", "a", "a", "b"}, "a", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newStopFilter(tt.stops)
			var got strings.Builder
			matched := false
			for _, d := range tt.deltas {
				safe, m := f.push(d)
				got.WriteString(safe)
				matched = matched || m
			}
			got.WriteString(f.flush())
			if got.String() != tt.want || matched != tt.matched {
				t.Errorf("got %q matched=%v, want %q matched=%v", got.String(), matched, tt.want, tt.matched)
			}
		})
	}
}

// Whatever way the text is split into deltas, the filtered output is the text up to the
// first stop string, and no stop string ever appears in it.
func TestStopFilterIsIndependentOfSplitting(t *testing.T) {
	text := "the river runs to the sea and the sea runs to the river"
	stops := []string{"sea and", "nothing"}
	want := text[:strings.Index(text, "sea and")]
	for step := 1; step <= len(text); step++ {
		f := newStopFilter(stops)
		var got strings.Builder
		for i := 0; i < len(text); i += step {
			safe, _ := f.push(text[i:min(i+step, len(text))])
			got.WriteString(safe)
		}
		got.WriteString(f.flush())
		if got.String() != want {
			t.Fatalf("step %d: got %q, want %q", step, got.String(), want)
		}
	}
}

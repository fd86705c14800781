package server

import "strings"

// stopFilter cuts streamed text at the first stop string. The backend is asked to apply the
// stop strings itself; this is the server's own guarantee that a stop string is never sent,
// whatever the backend does. To catch a stop string split across deltas it holds back the
// longest tail that could still begin one, so with stop strings a stream lags by at most
// len(longest stop)-1 bytes; without them nothing is held.
type stopFilter struct {
	stops   []string
	held    string
	matched bool
	// matchedStop is the stop string that ended the output, once matched.
	matchedStop string
}

func newStopFilter(stops []string) *stopFilter {
	return &stopFilter{stops: stops}
}

// push takes the next delta and returns the text that is safe to send. matched is true once
// a stop string was found; everything from it on is dropped, and later pushes return "".
func (f *stopFilter) push(text string) (safe string, matched bool) {
	if f.matched {
		return "", true
	}
	if len(f.stops) == 0 {
		return text, false
	}
	buf := f.held + text
	if cut, stop := f.firstStop(buf); cut >= 0 {
		f.matched, f.held, f.matchedStop = true, "", stop
		return buf[:cut], true
	}
	keep := f.partialTail(buf)
	f.held = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

// flush returns the held-back tail at the end of a generation that no stop string ended:
// it was real output that merely looked like the start of a stop string.
func (f *stopFilter) flush() string {
	held := f.held
	f.held = ""
	if f.matched {
		return ""
	}
	return held
}

// firstStop is the index of the earliest stop string in buf and that string, or -1.
func (f *stopFilter) firstStop(buf string) (int, string) {
	cut, stop := -1, ""
	for _, s := range f.stops {
		if i := strings.Index(buf, s); i >= 0 && (cut < 0 || i < cut) {
			cut, stop = i, s
		}
	}
	return cut, stop
}

// partialTail is the length of the longest suffix of buf that is a proper prefix of some
// stop string. A stop string starts on a rune boundary, so the cut never splits a rune.
func (f *stopFilter) partialTail(buf string) int {
	longest := 0
	for _, s := range f.stops {
		for n := min(len(s)-1, len(buf)); n > longest; n-- {
			if strings.HasSuffix(buf, s[:n]) {
				longest = n
				break
			}
		}
	}
	return longest
}

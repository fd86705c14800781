package engine

import "strings"

// output collects committed tokens, applies stop tokens and stop strings, and holds back
// text that might be the start of a stop string so nothing of a stop string is emitted.
type output struct {
	stopTokens map[int32]bool
	stop       []string
	detok      Detokenizer
	maxTokens  int

	tokens  []int32
	text    strings.Builder
	held    string // decoded text not yet emitted (possible stop-string prefix)
	done    bool
	finish  string
	pending Event
}

func newOutput(req Request, eos []int) *output {
	o := &output{stop: req.Stop, detok: req.Detok, maxTokens: req.MaxTokens, stopTokens: map[int32]bool{}}
	if req.StopTokens != nil {
		for _, t := range req.StopTokens {
			o.stopTokens[t] = true
		}
	} else if !req.IgnoreEOS {
		for _, t := range eos {
			o.stopTokens[int32(t)] = true
		}
	}
	return o
}

// push commits one token; it reports false once the generation is over.
func (o *output) push(tok int32) bool {
	if o.done {
		return false
	}
	if o.stopTokens[tok] {
		o.end(FinishStop)
		return false
	}
	o.tokens = append(o.tokens, tok)
	o.pending.Tokens = append(o.pending.Tokens, tok)
	if o.detok != nil {
		o.held += o.detok.Add(tok)
		if o.matchStop() {
			return false
		}
		o.release(false)
	}
	if len(o.tokens) >= o.maxTokens {
		o.end(FinishLength)
		return false
	}
	return true
}

// matchStop ends the generation at the first stop string in the held text.
func (o *output) matchStop() bool {
	first := -1
	for _, s := range o.stop {
		if i := strings.Index(o.held, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first < 0 {
		return false
	}
	o.emitText(o.held[:first])
	o.held = ""
	o.done, o.finish = true, FinishStop
	return true
}

// release emits held text except a suffix that could still grow into a stop string.
func (o *output) release(final bool) {
	keep := 0
	if !final {
		for _, s := range o.stop {
			for k := min(len(s)-1, len(o.held)); k > keep; k-- {
				if strings.HasSuffix(o.held, s[:k]) {
					keep = k
					break
				}
			}
		}
	}
	o.emitText(o.held[:len(o.held)-keep])
	o.held = o.held[len(o.held)-keep:]
}

func (o *output) emitText(s string) {
	o.text.WriteString(s)
	o.pending.Text += s
}

func (o *output) end(reason string) {
	if o.done {
		return
	}
	o.done, o.finish = true, reason
	if o.detok != nil {
		o.held += o.detok.Flush()
		if !o.matchStop() {
			o.release(true)
		}
	}
}

// take returns and clears the event accumulated since the last call.
func (o *output) take() (Event, bool) {
	ev := o.pending
	o.pending = Event{}
	return ev, len(ev.Tokens) > 0 || ev.Text != ""
}

package server

import (
	"net/http"
	"time"
)

// answerWriter delivers one answer to the client, streaming or not. The generation runner
// calls begin once the generation slot is held, write for each batch of events, and then
// either end or abort.
type answerWriter interface {
	begin() error
	write(events []chatEvent) error
	end(o outcome) error
	// abort reports an error that happened after begin: a JSON error response when nothing
	// was sent yet, an in-stream error event otherwise.
	abort(e *apiError)
	// probe writes a liveness probe once begin has run: an SSE comment in a stream. A full
	// answer has sent nothing by then and returns nil: an informational response probes.
	probe() func() error
}

// keepAliver is an answerWriter whose stream must not stay silent for long: keepAlive
// starts pings once begin has run, and returns the function that stops them.
type keepAliver interface {
	keepAlive(interval time.Duration) (stop func())
}

// outcome is how a generation ended, as the client sees it.
type outcome struct {
	finish string // "stop", "length" or "tool_calls"
	// stopSequence is the stop string that ended the answer when the server applied it
	// (generation.serverStops); "" otherwise.
	stopSequence string
	// contextBound: a "length" finish ran out of context, not of the requested max tokens.
	contextBound bool
	// reasoningTokens are the completion tokens spent in the reasoning (see
	// runOutcome.reasoningTokens).
	reasoningTokens int
	usage           usage
	stats           dflashStats
}

// answerMeta is what every response object of one request shares.
type answerMeta struct {
	id           string
	created      int64
	model        string
	includeUsage bool
}

func newAnswerMeta(idPrefix, model string, includeUsage bool) answerMeta {
	return answerMeta{id: randomID(idPrefix), created: time.Now().Unix(), model: model, includeUsage: includeUsage}
}

// chunkUsage is the usage field of a streamed chunk other than the usage chunk.
func (m answerMeta) chunkUsage() []byte {
	if m.includeUsage {
		return jsonNull
	}
	return nil
}

// writeFinal sends a complete non-streaming JSON answer, bounded by the write timeout.
func writeFinal(w http.ResponseWriter, writeTimeout time.Duration, v any) {
	if writeTimeout > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
	}
	writeJSON(w, http.StatusOK, v)
}

func ptr[T any](v T) *T { return &v }

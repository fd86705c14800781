package server

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// sseStream writes Server-Sent Events: each event is "data: <json>\n\n", flushed at once,
// and the stream ends with "data: [DONE]\n\n" as OpenAI's does.
type sseStream struct {
	mu           sync.Mutex // a probe may write between the generation's events
	w            http.ResponseWriter
	rc           *http.ResponseController
	writeTimeout time.Duration
	lastWrite    time.Time // guarded by mu
}

func newSSEStream(w http.ResponseWriter, writeTimeout time.Duration) *sseStream {
	return &sseStream{w: w, rc: http.NewResponseController(w), writeTimeout: writeTimeout}
}

// start sends the 200 status and the event-stream headers.
func (s *sseStream) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // tell reverse proxies not to buffer the stream
	s.w.WriteHeader(http.StatusOK)
	return s.flush()
}

// send writes v as one event.
func (s *sseStream) send(v any) error {
	payload, err := marshalJSON(v)
	if err != nil {
		return fmt.Errorf("encoding stream event: %w", err)
	}
	return s.write(append(append([]byte("data: "), payload...), '\n', '\n'))
}

// sendNamed writes v as one event with an "event:" line naming it. The Responses and
// Messages APIs name every event; Anthropic's SDK skips events that have no name.
func (s *sseStream) sendNamed(name string, v any) error {
	payload, err := marshalJSON(v)
	if err != nil {
		return fmt.Errorf("encoding stream event %s: %w", name, err)
	}
	b := make([]byte, 0, len(name)+len(payload)+16)
	b = append(append(append(b, "event: "...), name...), "\ndata: "...)
	return s.write(append(append(b, payload...), '\n', '\n'))
}

// done writes the terminating event.
func (s *sseStream) done() error {
	return s.write([]byte("data: [DONE]\n\n"))
}

// ping writes a comment line, which SSE clients skip: a probe of whether the client is
// still there.
func (s *sseStream) ping() error {
	return s.write([]byte(": ping\n\n"))
}

func (s *sseStream) write(b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A per-write deadline: a client that stops reading is cut after writeTimeout, while a
	// long generation that keeps writing is never cut.
	if s.writeTimeout > 0 {
		if err := s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return fmt.Errorf("setting the write deadline: %w", err)
		}
	}
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("writing stream event: %w", err)
	}
	s.lastWrite = time.Now()
	return s.flush()
}

// keepAlive calls ping whenever the stream has been silent for interval (a long prefill, a
// long tool call being written), so that clients and proxies with idle timeouts keep the
// connection. stop ends it and waits for a ping in flight: the caller must call it before
// the handler returns, as nothing may write to the response after that.
func (s *sseStream) keepAlive(interval time.Duration, ping func() error) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(interval / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			s.mu.Lock()
			quiet := time.Since(s.lastWrite) >= interval
			s.mu.Unlock()
			if quiet && ping() != nil {
				return // the client is gone; the generation notices on its next write
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

func (s *sseStream) flush() error {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flushing stream: %w", err)
	}
	return nil
}

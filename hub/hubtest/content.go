package hubtest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// FaultKind says how a faulty transfer misbehaves.
type FaultKind int

const (
	// Cut sends After bytes of the body, then drops the connection (the client sees an
	// unexpected EOF or a reset, with the Content-Length promised in full).
	Cut FaultKind = iota + 1
	// Stall sends After bytes of the body, then sends nothing more until the client goes away.
	Stall
	// Slow sends the body in 32 KiB chunks with ChunkDelay between them.
	Slow
	// IgnoreRange answers 200 with the whole file even when a Range was asked for, as some
	// proxies do.
	IgnoreRange
	// Corrupt sends the full length with the byte at offset After (of the file) inverted, as a
	// broken proxy might; only a checksum can tell.
	Corrupt
)

// Fault describes a misbehaving transfer of one file's content (GET only; HEAD is unaffected).
type Fault struct {
	Kind       FaultKind
	After      int64
	ChunkDelay time.Duration
	// Times is how many GET requests the fault affects; 0 means one.
	Times int
}

type faultKey struct{ repoID, path string }

// InjectFault makes the next GETs of a file's content misbehave, whether the content is served by
// the resolve endpoint (regular files) or by the CDN (LFS files).
func (s *Server) InjectFault(repoID, path string, f Fault) {
	if f.Times <= 0 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[faultKey{repoID, path}] = &f
}

// takeFault consumes one use of the fault registered for key, if any.
func (s *Server) takeFault(key faultKey) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults[key]
	if f == nil || f.Times <= 0 {
		return nil
	}
	f.Times--
	c := *f
	return &c
}

const chunkSize = 32 << 10

// serveContent writes data honouring a single "bytes=N-" or "bytes=N-M" Range, and applies an
// injected fault. It returns the status it answered, and tells announce before sending the body
// (a Cut fault never returns).
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request, data []byte, key faultKey, announce func(status int)) int {
	h := w.Header()
	h.Set("Accept-Ranges", "bytes")
	total := int64(len(data))
	start, end, status := int64(0), total, http.StatusOK
	var fault *Fault
	if r.Method == http.MethodGet {
		fault = s.takeFault(key)
	}
	if spec := r.Header.Get("Range"); spec != "" && (fault == nil || fault.Kind != IgnoreRange) {
		var ok bool
		start, end, ok = parseRange(spec, total)
		if !ok {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", total))
			announce(http.StatusRequestedRangeNotSatisfiable)
			http.Error(w, "range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return http.StatusRequestedRangeNotSatisfiable
		}
		status = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, total))
	}
	h.Set("Content-Length", strconv.FormatInt(end-start, 10))
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/octet-stream")
	}
	announce(status)
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return status
	}
	body := data[start:end]
	if fault != nil && fault.Kind == IgnoreRange {
		fault = nil
	}
	if fault != nil && fault.Kind == Corrupt {
		body = append([]byte(nil), body...)
		if i := fault.After - start; i >= 0 && i < int64(len(body)) {
			body[i] ^= 0xff
		}
		fault = nil
	}
	if fault == nil {
		_, _ = w.Write(body)
		return status
	}
	flusher, _ := w.(http.Flusher)
	sent := int64(0)
	for sent < int64(len(body)) {
		if (fault.Kind == Cut || fault.Kind == Stall) && sent >= fault.After {
			break
		}
		n := min(int64(chunkSize), int64(len(body))-sent)
		if fault.Kind != Slow {
			n = min(n, fault.After-sent)
		}
		if _, err := w.Write(body[sent : sent+n]); err != nil {
			return status
		}
		sent += n
		if flusher != nil {
			flusher.Flush()
		}
		if fault.Kind == Slow {
			select {
			case <-time.After(fault.ChunkDelay):
			case <-r.Context().Done():
				return status
			}
		}
	}
	switch fault.Kind {
	case Cut:
		if sent < int64(len(body)) {
			// Aborting the handler makes net/http drop the connection without finishing the body.
			panic(http.ErrAbortHandler)
		}
	case Stall:
		<-r.Context().Done()
	}
	return status
}

// parseRange reads one byte range and returns the half-open interval [start, end).
func parseRange(spec string, total int64) (start, end int64, ok bool) {
	rest, found := strings.CutPrefix(spec, "bytes=")
	if !found || strings.Contains(rest, ",") {
		return 0, 0, false
	}
	first, last, found := strings.Cut(rest, "-")
	if !found || first == "" {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 || start >= total {
		return 0, 0, false
	}
	end = total
	if last != "" {
		l, err := strconv.ParseInt(last, 10, 64)
		if err != nil || l < start {
			return 0, 0, false
		}
		end = min(l+1, total)
	}
	return start, end, true
}

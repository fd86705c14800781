package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// errClientGone is the cancellation cause of a generation whose client disconnected or
// stopped reading.
var errClientGone = errors.New("the client is gone")

// connSendBuffer bounds the kernel's send buffer of each connection. Left to autotuning it
// grows to megabytes, enough to swallow a whole long stream for a client that stopped
// reading, so no write would ever stall and Config.WriteTimeout could never cut it. 64 KiB
// still carries a stream at several MB/s over a 10 ms round trip.
const connSendBuffer = 64 << 10

// clientListener wraps the listener Serve answers on: it bounds each connection's send
// buffer and records how the connection's reads and writes end, which is what tells a
// client that half-closed its side from one that is gone.
type clientListener struct{ net.Listener }

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetWriteBuffer(connSendBuffer) // best effort: the default only loosens the bound
	}
	return &clientConn{Conn: c}, nil
}

// clientConn is one accepted connection, with the way its reads and writes ended.
type clientConn struct {
	net.Conn
	readEOF     atomic.Bool // the client closed its sending side; it may still read
	readFailed  atomic.Bool // reading failed otherwise (a reset): the client is gone
	writeFailed atomic.Bool // a write failed or timed out: nothing more reaches the client
}

func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var ne net.Error
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		c.readEOF.Store(true)
	case errors.As(err, &ne) && ne.Timeout():
		// net/http sets read deadlines of its own (timeouts, aborting a background read).
	default:
		c.readFailed.Store(true)
	}
	return n, err
}

func (c *clientConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.writeFailed.Store(true)
	}
	return n, err
}

// CloseWrite keeps net/http's lingering close (it half-closes before closing, so that a
// client still sending reads the error response instead of a reset).
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// gone reports whether the connection is known to be dead.
func (c *clientConn) gone() bool { return c.readFailed.Load() || c.writeFailed.Load() }

type clientConnKey struct{}

// connContext is http.Server.ConnContext: it makes the connection reachable from its
// requests' contexts.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if cc, ok := c.(*clientConn); ok {
		return context.WithValue(ctx, clientConnKey{}, cc)
	}
	return ctx
}

// probeWaits are the pauses before each liveness probe. A client that is gone answers the
// first probe with a reset, which fails a later write, so the spacing covers round trips
// up to about a second; a client that survives them all only half-closed, and is answered.
var probeWaits = []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond, time.Second}

// clientWatch ends a generation's context when its client disconnects.
//
// net/http cancels a request's context as soon as the connection's read side ends, but a
// client may half-close after sending its request and still read the answer (legal in
// HTTP/1.1). So an end of input only starts a check: the watch writes a few bytes that
// every client ignores (a 102 Processing response before the answer, an SSE comment in a
// stream); a client that is gone answers them with a reset, and the next write fails.
// Served through Handler alone, without Serve, the connection cannot be observed, and the
// end of the request's context is taken as a disconnect.
type clientWatch struct {
	conn   *clientConn
	cancel context.CancelCauseFunc

	mu sync.Mutex // held while probing, so that setProbe waits for a probe in flight
	// probe writes one probe and reports whether the write failed; nil while the handler
	// itself owns the response (setting headers, writing the answer).
	probe func() error

	changed  chan struct{} // signalled when probe changes
	stopOnce sync.Once
	stopped  chan struct{}
	exited   chan struct{}
}

// watchClient returns the context a generation runs under, derived from r's values but
// not from its cancellation, and the watch that cancels it. The caller must call stop
// before the handler returns.
func (s *Server) watchClient(r *http.Request) (context.Context, context.CancelCauseFunc, *clientWatch) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(r.Context()))
	cw := &clientWatch{cancel: cancel, changed: make(chan struct{}, 1), stopped: make(chan struct{}), exited: make(chan struct{})}
	cw.conn, _ = r.Context().Value(clientConnKey{}).(*clientConn)
	go cw.run(r.Context())
	return ctx, cancel, cw
}

func (cw *clientWatch) run(req context.Context) {
	defer close(cw.exited)
	select {
	case <-cw.stopped:
		return
	case <-req.Done():
	}
	if cw.conn == nil || cw.conn.gone() || !cw.conn.readEOF.Load() {
		cw.cancel(errClientGone)
		return
	}
	for i := 0; i < len(probeWaits); {
		select {
		case <-cw.stopped:
			return
		case <-time.After(probeWaits[i]):
		}
		probed, err := cw.probeOnce()
		if err != nil || cw.conn.gone() {
			cw.cancel(errClientGone)
			return
		}
		if probed {
			i++
			continue
		}
		// No probe fits the response now: wait until one does.
		select {
		case <-cw.stopped:
			return
		case <-cw.changed:
		}
	}
}

// probeOnce writes one probe if the response allows one now.
func (cw *clientWatch) probeOnce() (probed bool, err error) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.probe == nil {
		return false, nil
	}
	return true, cw.probe()
}

// setProbe changes how the client is probed; nil hands the response to the handler alone
// and waits for a probe in flight to end.
func (cw *clientWatch) setProbe(probe func() error) {
	cw.mu.Lock()
	cw.probe = probe
	cw.mu.Unlock()
	select {
	case cw.changed <- struct{}{}:
	default:
	}
}

// stop ends the watch and waits for it, so that it never writes after the handler returns.
func (cw *clientWatch) stop() {
	cw.stopOnce.Do(func() { close(cw.stopped) })
	<-cw.exited
}

// informationalProbe writes a 102 Processing response, which HTTP/1.1 clients skip while
// they wait for the final one. HTTP/1.0 clients must not get one: it returns nil for them.
func informationalProbe(w http.ResponseWriter, r *http.Request, conn *clientConn, writeTimeout time.Duration) func() error {
	if !r.ProtoAtLeast(1, 1) || conn == nil {
		return nil
	}
	rc := http.NewResponseController(w)
	return func() error {
		if writeTimeout > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		}
		w.WriteHeader(http.StatusProcessing)
		if conn.writeFailed.Load() {
			return errClientGone
		}
		return nil
	}
}

package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Server is the OpenAI-compatible HTTP API over one Backend.
type Server struct {
	cfg     Config
	backend Backend
	log     *slog.Logger
	queue   *generationQueue
	metrics *metrics
	handler http.Handler
	// responses keeps finished /v1/responses answers (bounded by Config.ResponseStoreBytes).
	responses *responseStore

	// hardStop is cancelled when the drain deadline passes: every generation and every
	// queued request still running is cancelled then.
	hardStop    context.Context
	stopAllWork context.CancelFunc
	served      atomic.Bool // a Server serves once: its drain is final
}

// cancelGrace is how long shutdown waits, after cancelling the work left at the drain
// deadline, for handlers to send their last bytes before connections are closed.
const cancelGrace = 5 * time.Second

// New returns a server for backend; cfg's unset fields take their defaults. A nil logger
// discards the log.
func New(cfg Config, backend Backend, logger *slog.Logger) (*Server, error) {
	if backend == nil {
		return nil, errors.New("server: no backend")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	hardStop, stopAllWork := context.WithCancel(context.Background())
	m := newMetrics()
	queue := newGenerationQueue(maxConcurrent(backend), cfg.queueLimit())
	queue.onArrival = m.observeQueueDepth
	if o, ok := backend.(StepObserverBackend); ok {
		o.ObserveSteps(m.observeStep)
	}
	s := &Server{
		cfg:         cfg,
		backend:     backend,
		log:         logger,
		queue:       queue,
		metrics:     m,
		responses:   newResponseStore(cfg.ResponseStoreBytes),
		hardStop:    hardStop,
		stopAllWork: stopAllWork,
	}
	s.handler = s.observe(s.cors(s.auth(http.HandlerFunc(s.dispatch))))
	return s, nil
}

// maxConcurrent is how many generations backend runs at once: its MaxConcurrent, or one.
func maxConcurrent(backend Backend) int {
	if c, ok := backend.(ConcurrentBackend); ok {
		return max(c.MaxConcurrent(), 1)
	}
	return 1
}

// Handler returns the server's HTTP handler, for tests and for embedding in another
// server; ListenAndServe and Serve use it too.
func (s *Server) Handler() http.Handler { return s.handler }

// ListenAndServe listens on Config.Host:Config.Port and serves until ctx ends, then drains
// (see Serve).
func (s *Server) ListenAndServe(ctx context.Context) error {
	addr := net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve answers requests on ln until ctx ends; it may be called once per Server. Then it drains: it stops accepting
// connections and new requests (503), lets running and queued requests finish for up to
// Config.DrainTimeout, cancels whatever still runs, and returns nil once every handler has
// returned. It returns an error only when serving itself fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		_ = ln.Close()
		return errors.New("server: Serve called twice; a Server serves once")
	}
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		// WriteTimeout stays 0: answers set a deadline per write instead (Config.WriteTimeout),
		// so a long stream is not cut while the client keeps reading.
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnContext: connContext,
	}
	s.log.Info("serving OpenAI-compatible API", "addr", "http://"+ln.Addr().String(),
		"model", s.backend.ModelID(), "context", s.backend.ContextLength(), "max_concurrent", s.queue.slots,
		"max_queue", s.cfg.queueLimit(), "auth", s.cfg.APIKey != "")
	served := make(chan error, 1)
	go func() { served <- hs.Serve(clientListener{ln}) }()
	select {
	case err := <-served:
		s.stopAllWork()
		return fmt.Errorf("serving HTTP on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.drain(hs)
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP on %s: %w", ln.Addr(), err)
	}
	return nil
}

func (s *Server) drain(hs *http.Server) {
	waiting, running := s.queue.depth()
	s.log.Info("draining", "deadline", s.cfg.DrainTimeout, "running", running, "queued", waiting)
	s.queue.close()
	deadline, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	if err := hs.Shutdown(deadline); err == nil {
		s.stopAllWork()
		s.log.Info("drained")
		return
	}
	s.log.Warn("drain deadline passed; cancelling the requests still running")
	s.stopAllWork()
	grace, cancelGraceCtx := context.WithTimeout(context.Background(), cancelGrace)
	defer cancelGraceCtx()
	if err := hs.Shutdown(grace); err != nil {
		s.log.Warn("closing connections that did not finish after cancellation", "err", err)
		_ = hs.Close()
	}
}

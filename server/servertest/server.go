package servertest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
)

// Running is a server serving on a loopback port.
type Running struct {
	URL    string // http://127.0.0.1:PORT, without a trailing slash
	Server *server.Server
	cancel context.CancelFunc
	served chan error
}

// Start serves backend on a free port of 127.0.0.1 until Stop or the end of the test.
// A nil logger discards the log.
func Start(t testing.TB, cfg server.Config, backend server.Backend, logger *slog.Logger) *Running {
	t.Helper()
	srv, err := server.New(cfg, backend, logger)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening on loopback: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{URL: "http://" + ln.Addr().String(), Server: srv, cancel: cancel, served: make(chan error, 1)}
	go func() { r.served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		if err := r.Stop(30 * time.Second); err != nil {
			t.Errorf("stopping the test server: %v", err)
		}
	})
	return r
}

// Stop begins the drain and waits up to timeout for Serve to return; it returns Serve's
// error. Calling it again returns nil at once.
func (r *Running) Stop(timeout time.Duration) error {
	r.cancel()
	select {
	case err, ok := <-r.served:
		if !ok {
			return nil
		}
		close(r.served)
		return err
	case <-time.After(timeout):
		return errors.New("servertest: Serve did not return after the drain")
	}
}

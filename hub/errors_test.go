package hub

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/hub/hubtest"
)

func TestHubErrors(t *testing.T) {
	srv := hubtest.New(t)
	files := modelFiles(50, 1000)
	srv.AddToken("hf_member")
	srv.AddToken("hf_accepted")
	srv.AddRepo("org/public", hubtest.Public).Commit("main", files...)
	srv.AddRepo("org/private", hubtest.Private).Commit("main", files...)
	gated := srv.AddRepo("org/gated", hubtest.Gated)
	gated.Commit("main", files...)
	gated.Grant("hf_accepted")

	tests := []struct {
		name       string
		repo       string
		token      string
		revision   string
		file       string // DownloadFile instead of Download
		wantKinds  []error
		wantStatus int
		wantInMsg  []string
	}{
		{name: "private without token", repo: "org/private",
			wantKinds: []error{ErrUnauthorized}, wantStatus: 401, wantInMsg: []string{"org/private", "HF_TOKEN"}},
		{name: "private with an ungranted token", repo: "org/private", token: "hf_member",
			wantKinds: []error{ErrRepoNotFound, ErrNotFound}, wantStatus: 404, wantInMsg: []string{"org/private", "not found"}},
		{name: "bad token", repo: "org/public", token: "hf_wrong",
			wantKinds: []error{ErrUnauthorized}, wantStatus: 401, wantInMsg: []string{"rejected the token", "HF_TOKEN"}},
		{name: "gated without token", repo: "org/gated",
			wantKinds: []error{ErrUnauthorized, ErrGated}, wantStatus: 401, wantInMsg: []string{"gated", "accept its license", srv.URL + "/org/gated", "HF_TOKEN"}},
		{name: "gated, license not accepted", repo: "org/gated", token: "hf_member",
			wantKinds: []error{ErrGated}, wantStatus: 403, wantInMsg: []string{"gated", "accept its license", srv.URL + "/org/gated"}},
		{name: "missing repository", repo: "org/nothing", token: "hf_member",
			wantKinds: []error{ErrRepoNotFound, ErrNotFound}, wantStatus: 404, wantInMsg: []string{"org/nothing", "not found"}},
		{name: "missing repository, anonymous", repo: "org/nothing",
			wantKinds: []error{ErrUnauthorized}, wantStatus: 401, wantInMsg: []string{"not found, or it is private"}},
		{name: "missing revision", repo: "org/public", revision: "no-such-branch",
			wantKinds: []error{ErrRevisionNotFound, ErrNotFound}, wantStatus: 404, wantInMsg: []string{`"no-such-branch"`}},
		{name: "missing revision of one file", repo: "org/public", revision: "v9", file: "config.json",
			wantKinds: []error{ErrRevisionNotFound, ErrNotFound}, wantStatus: 404, wantInMsg: []string{`"v9"`}},
		{name: "missing file", repo: "org/public", file: "nope.json",
			wantKinds: []error{ErrEntryNotFound, ErrNotFound}, wantStatus: 404, wantInMsg: []string{`"nope.json"`}},
		{name: "gated single file without token", repo: "org/gated", file: "config.json",
			wantKinds: []error{ErrUnauthorized, ErrGated}, wantStatus: 401, wantInMsg: []string{"accept its license"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, srv)
			c.Token = tc.token
			opts := DownloadOptions{Revision: tc.revision, Quiet: true}
			var err error
			if tc.file != "" {
				_, err = c.DownloadFile(context.Background(), tc.repo, tc.file, opts)
			} else {
				_, err = c.Download(context.Background(), tc.repo, opts)
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, k := range tc.wantKinds {
				if !errors.Is(err, k) {
					t.Errorf("errors.Is(%v, %v) = false", err, k)
				}
			}
			var he *Error
			if !errors.As(err, &he) || he.Status != tc.wantStatus {
				t.Errorf("err = %#v, want *Error with status %d", err, tc.wantStatus)
			}
			for _, s := range tc.wantInMsg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err, s)
				}
			}
		})
	}

	t.Run("gated with accepted license works", func(t *testing.T) {
		c := newTestClient(t, srv)
		c.Token = "hf_accepted"
		if _, err := c.Download(context.Background(), "org/gated", quiet); err != nil {
			t.Fatal(err)
		}
	})
}

func TestUnreachableEndpoint(t *testing.T) {
	// A port that was just free: connecting to it is refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close()

	c := NewClient(Env{Endpoint: endpoint, CacheDir: t.TempDir()})
	for name, run := range map[string]func() error{
		"Download": func() error { _, err := c.Download(context.Background(), testRepo, quiet); return err },
		"DownloadFile": func() error {
			_, err := c.DownloadFile(context.Background(), testRepo, "config.json", quiet)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := run()
			if !errors.Is(err, ErrUnreachable) {
				t.Fatalf("err = %v, want ErrUnreachable", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "cannot reach "+endpoint) || !strings.Contains(msg, "set HF_HUB_OFFLINE=1 to use the cache") {
				t.Errorf("message %q should name the endpoint and suggest offline mode", msg)
			}
		})
	}
}

func TestNotAHubEndpoint(t *testing.T) {
	// A web server that is not a Hub, e.g. a mistyped HF_ENDPOINT: it answers everything with a page.
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html>hello</html>"))
	}))
	defer web.Close()
	c := NewClient(Env{Endpoint: web.URL, CacheDir: t.TempDir()})

	_, err := c.DownloadFile(context.Background(), testRepo, "config.json", quiet)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "X-Repo-Commit") || !strings.Contains(err.Error(), web.URL) {
		t.Errorf("DownloadFile: err = %v, want ErrProtocol naming X-Repo-Commit and the endpoint", err)
	}
	_, err = c.Download(context.Background(), testRepo, quiet)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "JSON") {
		t.Errorf("Download: err = %v, want ErrProtocol about the listing", err)
	}
}

func TestInvalidNames(t *testing.T) {
	c := NewClient(Env{Endpoint: "http://127.0.0.1:1", CacheDir: t.TempDir()})
	ctx := context.Background()
	for _, id := range []string{"", "a/b/c", "../x", "org/..", "org/na--me", "org/", "/name", "org/na me"} {
		if _, err := c.Download(ctx, id, quiet); err == nil || errors.Is(err, ErrUnreachable) {
			t.Errorf("Download(%q) = %v, want a validation error before any request", id, err)
		}
	}
	for _, rev := range []string{"../../etc", "/abs", "a//b", `a\b`} {
		if _, err := c.Download(ctx, testRepo, DownloadOptions{Revision: rev, Quiet: true}); err == nil || errors.Is(err, ErrUnreachable) {
			t.Errorf("revision %q: err = %v, want a validation error", rev, err)
		}
	}
	for _, p := range []string{"../x.json", "/etc/passwd", "a/../../b", `C:\x`, "a//b"} {
		if _, err := c.DownloadFile(ctx, testRepo, p, quiet); err == nil || errors.Is(err, ErrUnreachable) {
			t.Errorf("file %q: err = %v, want a validation error", p, err)
		}
	}
}

func TestNoCacheDir(t *testing.T) {
	c := NewClient(Env{Endpoint: "http://127.0.0.1:1"})
	if _, err := c.Download(context.Background(), testRepo, quiet); err == nil || !strings.Contains(err.Error(), "no cache folder") {
		t.Errorf("Download without a cache folder: %v", err)
	}
	if _, err := c.DownloadFile(context.Background(), testRepo, "config.json", quiet); err == nil || !strings.Contains(err.Error(), "no cache folder") {
		t.Errorf("DownloadFile without a cache folder: %v", err)
	}
}

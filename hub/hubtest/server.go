package hubtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a fake Hugging Face Hub with a separate CDN for LFS files, both on 127.0.0.1.
type Server struct {
	// URL is the Hub endpoint (what HF_ENDPOINT would be set to), without a trailing slash.
	URL string
	// CDNURL is the origin LFS downloads are redirected to.
	CDNURL string

	hub, cdn *httptest.Server
	secret   string // signs CDN URLs

	mu       sync.Mutex
	repos    map[string]*Repo
	renamed  map[string]string // old repo ID -> current repo ID
	tokens   map[string]bool
	faults   map[faultKey]*Fault
	requests []Request
	changed  chan struct{} // closed and replaced whenever a request is recorded
}

// Request is one request the server received, for assertions.
type Request struct {
	// Origin is "hub" or "cdn".
	Origin string
	Method string
	// Path is the unescaped URL path; RawQuery the query string.
	Path     string
	RawQuery string
	// Range and Authorization are the request's headers of those names ("" when absent).
	Range         string
	Authorization string
	UserAgent     string
	// RepoID and File are set for content requests (resolve and CDN) once the server has matched
	// the request to a repository file.
	RepoID string
	File   string
	// Status is the status code the server answered.
	Status int
}

// New starts a fake Hub and a fake CDN; both are closed when the test ends.
func New(t testing.TB) *Server {
	t.Helper()
	s := Start()
	t.Cleanup(s.Close)
	return s
}

// Start starts a fake Hub outside of a test (a helper process, a demo); call Close when done.
func Start() *Server {
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		panic("hubtest: no randomness: " + err.Error())
	}
	s := &Server{
		secret:  hex.EncodeToString(key),
		repos:   map[string]*Repo{},
		renamed: map[string]string{},
		tokens:  map[string]bool{},
		faults:  map[faultKey]*Fault{},
		changed: make(chan struct{}),
	}
	s.hub = httptest.NewServer(http.HandlerFunc(s.serveHub))
	s.cdn = httptest.NewServer(http.HandlerFunc(s.serveCDN))
	s.URL = s.hub.URL
	s.CDNURL = s.cdn.URL
	return s
}

// Close shuts both servers down, cutting open connections.
func (s *Server) Close() {
	s.hub.CloseClientConnections()
	s.cdn.CloseClientConnections()
	s.hub.Close()
	s.cdn.Close()
}

// AddRepo creates an empty repository; add content with Repo.Commit.
func (s *Server) AddRepo(id string, access Access) *Repo {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &Repo{s: s, id: id, access: access, granted: map[string]bool{}, commits: map[string]*commit{}, refs: map[string]string{}}
	s.repos[id] = r
	return r
}

// AddToken makes token a valid credential. Without Repo.Grant it reads public repositories only.
func (s *Server) AddToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[token] = true
}

// Rename makes oldID a redirect to the existing repository newID, as the Hub does after a rename:
// requests under the old name answer 307 with a relative Location under the new name.
func (s *Server) Rename(oldID, newID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renamed[oldID] = newID
}

// Requests returns a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count returns how many recorded requests satisfy match.
func (s *Server) Count(match func(Request) bool) int {
	n := 0
	for _, r := range s.Requests() {
		if match(r) {
			n++
		}
	}
	return n
}

// WaitFor blocks until a recorded request satisfies match, or ctx ends.
func (s *Server) WaitFor(ctx context.Context, match func(Request) bool) error {
	for {
		s.mu.Lock()
		for _, r := range s.requests {
			if match(r) {
				s.mu.Unlock()
				return nil
			}
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// record appends a request to the log and returns its index so the handler can fill in details.
func (s *Server) record(origin string, r *http.Request) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{
		Origin:        origin,
		Method:        r.Method,
		Path:          r.URL.Path,
		RawQuery:      r.URL.RawQuery,
		Range:         r.Header.Get("Range"),
		Authorization: r.Header.Get("Authorization"),
		UserAgent:     r.Header.Get("User-Agent"),
	})
	s.notifyLocked()
	return len(s.requests) - 1
}

// annotate fills in what the handler learnt about request i.
func (s *Server) annotate(i int, repoID, file string, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[i].RepoID = repoID
	s.requests[i].File = file
	s.requests[i].Status = status
	s.notifyLocked()
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Env returns the environment a child process (Python's huggingface_hub, or a re-executed test
// binary) needs to use this server and cacheDir, with telemetry off and no user token file.
func (s *Server) Env(cacheDir, hfHome string) []string {
	return []string{
		"HF_ENDPOINT=" + s.URL,
		"HF_HUB_CACHE=" + cacheDir,
		"HF_HOME=" + hfHome,
		"HF_HUB_DISABLE_TELEMETRY=1",
		"HF_HUB_DISABLE_PROGRESS_BARS=1",
		"HF_HUB_OFFLINE=0",
	}
}

// hubError answers like the Hub does: X-Error-Code and X-Error-Message headers and a JSON body.
func hubError(w http.ResponseWriter, status int, code, message string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", message)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": message})
}

// authorize applies the Hub's access rules. It returns the repository when the request may
// proceed; otherwise it has answered the request and returns nil and the status it answered.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, repoID string) (*Repo, int) {
	token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	hasToken := r.Header.Get("Authorization") != ""

	s.mu.Lock()
	repo := s.repos[repoID]
	validToken := s.tokens[token]
	granted := repo != nil && repo.granted[token] && validToken
	s.mu.Unlock()

	if hasToken && !validToken {
		hubError(w, http.StatusUnauthorized, "", "Invalid credentials in Authorization header")
		return nil, http.StatusUnauthorized
	}
	notFound := func() (*Repo, int) {
		status := http.StatusNotFound
		if !hasToken {
			// The Hub cannot tell an anonymous caller whether a private repository exists.
			status = http.StatusUnauthorized
		}
		hubError(w, status, "RepoNotFound", "Repository not found")
		return nil, status
	}
	if repo == nil {
		return notFound()
	}
	switch repo.access {
	case Private:
		if !granted {
			return notFound()
		}
	case Gated:
		if !hasToken {
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+repoID+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
			return nil, http.StatusUnauthorized
		}
		if !granted {
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+repoID+" is restricted and you are not in the authorized list. Visit "+s.URL+"/"+repoID+" to ask for access.")
			return nil, http.StatusForbidden
		}
	}
	return repo, 0
}

// redirectRenamed answers 307 to the repository's new name when repoID was renamed.
func (s *Server) redirectRenamed(w http.ResponseWriter, r *http.Request, repoID string) bool {
	s.mu.Lock()
	newID, ok := s.renamed[repoID]
	s.mu.Unlock()
	if !ok {
		return false
	}
	// A relative Location, as the Hub sends: clients must resolve it against the request URL.
	target := strings.Replace(r.URL.EscapedPath(), "/"+repoID+"/", "/"+newID+"/", 1)
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusTemporaryRedirect)
	return true
}

// signCDN returns the signed CDN URL of an LFS file.
func (s *Server) signCDN(sha, repoID, path string) string {
	expires := time.Now().Add(time.Hour).Unix()
	q := url.Values{}
	q.Set("repo", repoID)
	q.Set("file", path)
	q.Set("Expires", itoa(expires))
	q.Set("Signature", s.signature(sha, repoID, path, expires))
	return s.CDNURL + "/repos/" + sha + "?" + q.Encode()
}

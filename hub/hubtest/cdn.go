package hubtest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serveCDN serves LFS content by sha256 at signed URLs, like the Hub's storage CDN.
func (s *Server) serveCDN(w http.ResponseWriter, r *http.Request) {
	idx := s.record("cdn", r)
	q := r.URL.Query()
	repoID, path := q.Get("repo"), q.Get("file")
	announce := func(status int) { s.annotate(idx, repoID, path, status) }
	announce(s.cdnAnswer(w, r, repoID, path, announce))
}

func (s *Server) cdnAnswer(w http.ResponseWriter, r *http.Request, repoID, path string, announce func(int)) int {
	sha, ok := strings.CutPrefix(r.URL.Path, "/repos/")
	if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		http.Error(w, "not found", http.StatusNotFound)
		return http.StatusNotFound
	}
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("Expires"), 10, 64)
	want := s.signature(sha, repoID, path, expires)
	if err != nil || !hmac.Equal([]byte(q.Get("Signature")), []byte(want)) || time.Now().Unix() > expires {
		// Like S3/CloudFront: a URL that was not handed out by the Hub is refused.
		http.Error(w, "<Error><Code>AccessDenied</Code></Error>", http.StatusForbidden)
		return http.StatusForbidden
	}
	data, found := s.lfsContent(repoID, path, sha)
	if !found {
		http.Error(w, "<Error><Code>NoSuchKey</Code></Error>", http.StatusNotFound)
		return http.StatusNotFound
	}
	w.Header().Set("ETag", `"`+sha+`"`)
	w.Header().Set("Content-Type", "binary/octet-stream")
	w.Header().Set("Content-Disposition", contentDisposition(path))
	return s.serveContent(w, r, data, faultKey{repoID, path}, announce)
}

// lfsContent finds the bytes of an LFS object of repoID by its sha256.
func (s *Server) lfsContent(repoID, path, sha string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	repo := s.repos[repoID]
	if repo == nil {
		return nil, false
	}
	for _, c := range repo.commits {
		if f := c.Files[path]; f != nil && f.SHA256 == sha {
			return f.Data, true
		}
	}
	return nil, false
}

func (s *Server) signature(sha, repoID, path string, expires int64) string {
	mac := hmac.New(sha256.New, []byte(s.secret))
	mac.Write([]byte(sha + "\x00" + repoID + "\x00" + path + "\x00" + itoa(expires)))
	return hex.EncodeToString(mac.Sum(nil))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

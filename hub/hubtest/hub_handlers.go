package hubtest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// TreePageSize is how many entries one page of the tree API holds (the Hub uses 1000).
var TreePageSize = 1000

// serveHub routes Hub requests. Paths are split on their escaped form because revisions such as
// "refs/pr/1" arrive percent-encoded ("refs%2Fpr%2F1") and must stay one segment.
func (s *Server) serveHub(w http.ResponseWriter, r *http.Request) {
	idx := s.record("hub", r)
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	status := s.routeHub(w, r, segs, idx)
	if status != 0 {
		s.mu.Lock()
		s.requests[idx].Status = status
		s.mu.Unlock()
	}
}

// admit is what every repository route does first: 404 when the path or method did not
// match (routed false), a redirect for a renamed repository, then authorization. A nil repo
// means the answer is written; status is what it was.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, repoID string, routed bool) (*Repo, int) {
	if !routed {
		hubError(w, http.StatusNotFound, "", "Sorry, we can't find the page you are looking for.")
		return nil, http.StatusNotFound
	}
	if s.redirectRenamed(w, r, repoID) {
		return nil, http.StatusTemporaryRedirect
	}
	return s.authorize(w, r, repoID)
}

// routeHub dispatches and returns the status it answered (0 when a handler recorded it itself).
func (s *Server) routeHub(w http.ResponseWriter, r *http.Request, segs []string, idx int) int {
	if len(segs) >= 2 && segs[0] == "api" && segs[1] == "models" {
		repoID, verb, rest, ok := splitRepo(segs[2:], "revision", "tree")
		repo, status := s.admit(w, r, repoID, ok && len(rest) > 0 && r.Method == http.MethodGet)
		if repo == nil {
			return status
		}
		rev := unescape(rest[0])
		if verb == "revision" {
			return s.serveRevision(w, r, repo, rev)
		}
		return s.serveTree(w, r, repo, rev, unescapeJoin(rest[1:]))
	}
	repoID, _, rest, ok := splitRepo(segs, "resolve")
	repo, status := s.admit(w, r, repoID, ok && len(rest) >= 2 && (r.Method == http.MethodGet || r.Method == http.MethodHead))
	if repo == nil {
		return status
	}
	s.serveResolve(w, r, repo, unescape(rest[0]), unescapeJoin(rest[1:]), idx)
	return 0
}

// splitRepo finds verb after a one- or two-segment repository ID ("gpt2" or "org/name").
func splitRepo(segs []string, verbs ...string) (repoID, verb string, rest []string, ok bool) {
	for n := 1; n <= 2 && n < len(segs); n++ {
		for _, v := range verbs {
			if segs[n] == v {
				return unescapeJoin(segs[:n]), v, segs[n+1:], true
			}
		}
	}
	return "", "", nil, false
}

func unescape(seg string) string {
	u, err := url.PathUnescape(seg)
	if err != nil {
		return seg
	}
	return u
}

func unescapeJoin(segs []string) string {
	out := make([]string, len(segs))
	for i, s := range segs {
		out[i] = unescape(s)
	}
	return strings.Join(out, "/")
}

type siblingJSON struct {
	RFilename string   `json:"rfilename"`
	Size      *int     `json:"size,omitempty"`
	BlobID    string   `json:"blobId,omitempty"`
	LFS       *lfsJSON `json:"lfs,omitempty"`
}

type lfsJSON struct {
	SHA256      string `json:"sha256,omitempty"`
	OID         string `json:"oid,omitempty"`
	Size        int    `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

// serveRevision answers the model info API for one revision.
func (s *Server) serveRevision(w http.ResponseWriter, r *http.Request, repo *Repo, rev string) int {
	s.mu.Lock()
	c := repo.resolveRevision(rev)
	s.mu.Unlock()
	if c == nil {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return http.StatusNotFound
	}
	withBlobs := r.URL.Query().Get("blobs") == "true" || r.URL.Query().Get("blobs") == "True"
	siblings := []siblingJSON{}
	for _, p := range c.sortedPaths() {
		f := c.Files[p]
		sib := siblingJSON{RFilename: p}
		if withBlobs {
			size := len(f.Data)
			sib.Size = &size
			sib.BlobID = f.BlobID
			if f.LFS {
				sib.LFS = &lfsJSON{SHA256: f.SHA256, Size: len(f.Data), PointerSize: f.PointerSize}
			}
		}
		siblings = append(siblings, sib)
	}
	org, _, _ := strings.Cut(repo.id, "/")
	body := map[string]any{
		"_id":          "hubtest-" + repo.id,
		"id":           repo.id,
		"modelId":      repo.id,
		"author":       org,
		"sha":          c.SHA,
		"lastModified": time.Unix(1700000000, 0).UTC().Format(time.RFC3339),
		"createdAt":    time.Unix(1690000000, 0).UTC().Format(time.RFC3339),
		"private":      repo.access == Private,
		"gated":        map[bool]any{true: "manual", false: false}[repo.access == Gated],
		"disabled":     false,
		"downloads":    0,
		"likes":        0,
		"tags":         []string{},
		"siblings":     siblings,
	}
	writeJSON(w, body)
	return http.StatusOK
}

type treeEntryJSON struct {
	Type string   `json:"type"`
	OID  string   `json:"oid"`
	Size int      `json:"size"`
	Path string   `json:"path"`
	LFS  *lfsJSON `json:"lfs,omitempty"`
}

// serveTree answers the tree API: the entries under dir, paginated with a cursor and a Link header.
func (s *Server) serveTree(w http.ResponseWriter, r *http.Request, repo *Repo, rev, dir string) int {
	s.mu.Lock()
	c := repo.resolveRevision(rev)
	s.mu.Unlock()
	if c == nil {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return http.StatusNotFound
	}
	recursive := strings.EqualFold(r.URL.Query().Get("recursive"), "true")
	entries := treeEntries(c, dir, recursive)
	if dir != "" && len(entries) == 0 {
		hubError(w, http.StatusNotFound, "EntryNotFound", dir+" does not exist on \""+rev+"\"")
		return http.StatusNotFound
	}
	start := 0
	if cur := r.URL.Query().Get("cursor"); cur != "" {
		start = atoi(cur)
	}
	start = min(start, len(entries))
	end := min(start+TreePageSize, len(entries))
	if end < len(entries) {
		q := r.URL.Query()
		q.Set("cursor", itoa(int64(end)))
		next := s.URL + r.URL.EscapedPath() + "?" + q.Encode()
		w.Header().Set("Link", "<"+next+">; rel=\"next\"")
	}
	writeJSON(w, entries[start:end])
	return http.StatusOK
}

// treeEntries lists files and directories under dir (all depths when recursive), sorted by path.
func treeEntries(c *commit, dir string, recursive bool) []treeEntryJSON {
	prefix := ""
	if dir != "" {
		prefix = strings.TrimSuffix(dir, "/") + "/"
	}
	dirs := map[string]bool{}
	var entries []treeEntryJSON
	for _, p := range c.sortedPaths() {
		if !strings.HasPrefix(p, prefix) {
			continue
		}
		rel := strings.TrimPrefix(p, prefix)
		parts := strings.Split(rel, "/")
		// Every directory between dir and the file is an entry of its own.
		for i := 1; i < len(parts); i++ {
			d := prefix + strings.Join(parts[:i], "/")
			if !dirs[d] && (recursive || i == 1) {
				dirs[d] = true
				entries = append(entries, treeEntryJSON{Type: "directory", OID: gitBlobID([]byte(d)), Path: d})
			}
		}
		if len(parts) > 1 && !recursive {
			continue
		}
		f := c.Files[p]
		e := treeEntryJSON{Type: "file", OID: f.BlobID, Size: len(f.Data), Path: p}
		if f.LFS {
			e.LFS = &lfsJSON{OID: f.SHA256, Size: len(f.Data), PointerSize: f.PointerSize}
		}
		entries = append(entries, e)
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	return entries
}

// serveResolve answers HEAD and GET on a file: regular files directly, LFS files by a redirect to
// the CDN carrying the metadata in X-Linked-* headers.
func (s *Server) serveResolve(w http.ResponseWriter, r *http.Request, repo *Repo, rev, path string, idx int) {
	s.mu.Lock()
	c := repo.resolveRevision(rev)
	var f *storedFile
	if c != nil {
		f = c.Files[path]
	}
	s.mu.Unlock()
	switch {
	case c == nil:
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		s.annotate(idx, repo.id, path, http.StatusNotFound)
		return
	case f == nil:
		w.Header().Set("X-Repo-Commit", c.SHA)
		hubError(w, http.StatusNotFound, "EntryNotFound", "Entry not found")
		s.annotate(idx, repo.id, path, http.StatusNotFound)
		return
	}
	h := w.Header()
	h.Set("X-Repo-Commit", c.SHA)
	h.Set("ETag", `"`+f.etag()+`"`)
	h.Set("Vary", "Origin, Accept-Encoding")
	if f.LFS {
		h.Set("X-Linked-Etag", `"`+f.SHA256+`"`)
		h.Set("X-Linked-Size", itoa(int64(len(f.Data))))
		h.Set("Location", s.signCDN(f.SHA256, repo.id, path))
		w.WriteHeader(http.StatusFound)
		s.annotate(idx, repo.id, path, http.StatusFound)
		return
	}
	h.Set("Content-Disposition", contentDisposition(path))
	announce := func(status int) { s.annotate(idx, repo.id, path, status) }
	s.serveContent(w, r, f.Data, faultKey{repo.id, path}, announce)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

func contentDisposition(path string) string {
	name := path[strings.LastIndex(path, "/")+1:]
	return `inline; filename*=UTF-8''` + url.PathEscape(name) + `; filename="` + name + `";`
}

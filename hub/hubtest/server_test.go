package hubtest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// noRedirects sees the Hub's redirects instead of following them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func do(t *testing.T, method, url string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func TestAccessRules(t *testing.T) {
	s := New(t)
	s.AddToken("good")
	s.AddToken("granted")
	s.AddRepo("o/public", Public).Commit("main", File{Path: "a.json", Data: []byte("{}")})
	p := s.AddRepo("o/private", Private)
	p.Commit("main", File{Path: "a.json", Data: []byte("{}")})
	p.Grant("granted")
	g := s.AddRepo("o/gated", Gated)
	g.Commit("main", File{Path: "a.json", Data: []byte("{}")})
	g.Grant("granted")

	tests := []struct {
		repo, token string
		status      int
		code        string
	}{
		{"o/public", "", 200, ""},
		{"o/public", "bad", 401, ""},
		{"o/private", "", 401, "RepoNotFound"},
		{"o/private", "good", 404, "RepoNotFound"},
		{"o/private", "granted", 200, ""},
		{"o/gated", "", 401, "GatedRepo"},
		{"o/gated", "good", 403, "GatedRepo"},
		{"o/gated", "granted", 200, ""},
		{"o/missing", "", 401, "RepoNotFound"},
		{"o/missing", "good", 404, "RepoNotFound"},
	}
	for _, tc := range tests {
		for _, url := range []string{s.URL + "/api/models/" + tc.repo + "/revision/main", s.URL + "/" + tc.repo + "/resolve/main/a.json"} {
			hdr := map[string]string{}
			if tc.token != "" {
				hdr["Authorization"] = "Bearer " + tc.token
			}
			resp, _ := do(t, "GET", url, hdr)
			if resp.StatusCode != tc.status || resp.Header.Get("X-Error-Code") != tc.code {
				t.Errorf("%s with token %q: %d %q, want %d %q", url, tc.token, resp.StatusCode, resp.Header.Get("X-Error-Code"), tc.status, tc.code)
			}
		}
	}
}

func TestResolveAndCDN(t *testing.T) {
	s := New(t)
	weights := []byte(strings.Repeat("0123456789", 1000))
	commit := s.AddRepo("o/m", Public).Commit("main", LFSIfWeights(
		File{Path: "model.safetensors", Data: weights},
		File{Path: "config.json", Data: []byte(`{"a":1}`)},
	)...)

	resp, _ := do(t, "HEAD", s.URL+"/o/m/resolve/main/model.safetensors", nil)
	loc := resp.Header.Get("Location")
	if resp.StatusCode != 302 || !strings.HasPrefix(loc, s.CDNURL+"/repos/") || resp.Header.Get("X-Repo-Commit") != commit ||
		resp.Header.Get("X-Linked-Size") != "10000" || len(strings.Trim(resp.Header.Get("X-Linked-Etag"), `"`)) != 64 {
		t.Fatalf("LFS HEAD: %d %v", resp.StatusCode, resp.Header)
	}
	resp, body := do(t, "GET", loc, map[string]string{"Range": "bytes=9990-"})
	if resp.StatusCode != 206 || string(body) != "0123456789" || resp.Header.Get("Content-Range") != "bytes 9990-9999/10000" {
		t.Errorf("CDN range: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, _ = do(t, "GET", loc, map[string]string{"Range": "bytes=10000-"})
	if resp.StatusCode != 416 || resp.Header.Get("Content-Range") != "bytes */10000" {
		t.Errorf("range past the end: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = do(t, "GET", strings.Replace(loc, "Signature=", "Signature=0", 1), nil)
	if resp.StatusCode != 403 {
		t.Errorf("forged CDN URL answered %d", resp.StatusCode)
	}

	resp, body = do(t, "GET", s.URL+"/o/m/resolve/"+commit+"/config.json", nil)
	if resp.StatusCode != 200 || string(body) != `{"a":1}` || resp.Header.Get("ETag") == "" || resp.Header.Get("X-Repo-Commit") != commit {
		t.Errorf("regular GET: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	resp, _ = do(t, "HEAD", s.URL+"/o/m/resolve/main/nope.json", nil)
	if resp.StatusCode != 404 || resp.Header.Get("X-Error-Code") != "EntryNotFound" || resp.Header.Get("X-Repo-Commit") != commit {
		t.Errorf("missing file: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = do(t, "HEAD", s.URL+"/o/m/resolve/nope/config.json", nil)
	if resp.StatusCode != 404 || resp.Header.Get("X-Error-Code") != "RevisionNotFound" {
		t.Errorf("missing revision: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestTreePagination(t *testing.T) {
	s := New(t)
	old := TreePageSize
	TreePageSize = 2
	t.Cleanup(func() { TreePageSize = old })
	s.AddRepo("o/m", Public).Commit("main",
		File{Path: "a.json", Data: []byte("1")}, File{Path: "d/b.json", Data: []byte("2")},
		File{Path: "d/e/c.json", Data: []byte("3")})

	var paths []string
	url := s.URL + "/api/models/o/m/tree/main?recursive=true"
	for url != "" {
		resp, body := do(t, "GET", url, nil)
		var page []struct{ Type, Path string }
		if err := json.Unmarshal(body, &page); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", url, resp.StatusCode, err)
		}
		for _, e := range page {
			paths = append(paths, e.Type+":"+e.Path)
		}
		url = ""
		if link := resp.Header.Get("Link"); link != "" {
			url = strings.TrimPrefix(strings.SplitN(link, ">", 2)[0], "<")
		}
	}
	want := "file:a.json directory:d file:d/b.json directory:d/e file:d/e/c.json"
	if strings.Join(paths, " ") != want {
		t.Errorf("tree = %v, want %s", paths, want)
	}
}

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		spec       string
		start, end int64
		ok         bool
	}{
		{"bytes=0-", 0, 100, true},
		{"bytes=10-", 10, 100, true},
		{"bytes=10-19", 10, 20, true},
		{"bytes=90-200", 90, 100, true},
		{"bytes=100-", 0, 0, false},
		{"bytes=-10", 0, 0, false},
		{"bytes=0-1,5-6", 0, 0, false},
		{"items=0-", 0, 0, false},
	} {
		start, end, ok := parseRange(tc.spec, 100)
		if ok != tc.ok || (ok && (start != tc.start || end != tc.end)) {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d, %v", tc.spec, start, end, ok, tc.start, tc.end, tc.ok)
		}
	}
}

package hub

import (
	"context"
	"net/http"
	"strconv"
)

// fileMeta is what a HEAD on a file's resolve URL tells about it.
type fileMeta struct {
	// Commit is X-Repo-Commit: the commit the revision resolved to.
	Commit string
	// ETag names the blob: X-Linked-Etag (the sha256 of an LFS file) when present, else ETag
	// (the git blob ID), without quotes.
	ETag string
	// Size is X-Linked-Size, else Content-Length of a non-redirect answer; -1 when unknown.
	Size int64
	// Location is where to GET the content: the CDN URL an LFS file redirects to, else the
	// resolve URL (after same-origin redirects).
	Location string
}

// headFile fetches a file's metadata the way huggingface_hub does: HEAD the resolve URL, follow
// redirects that stay on the Hub, and stop at a redirect to another origin, whose answer carries
// the metadata in X-Linked-* headers.
func (c *Client) headFile(ctx context.Context, repoID, revision, repoPath string) (fileMeta, error) {
	t := target{repoID: repoID, revision: revision, file: repoPath}
	resp, err := c.send(ctx, http.MethodHead, c.fileURL(repoID, revision, repoPath), nil, false)
	if err != nil {
		return fileMeta{}, err
	}
	defer drainClose(resp.Body)
	if resp.StatusCode >= 400 {
		return fileMeta{}, c.httpError(t, resp)
	}
	h := resp.Header
	redirected := resp.StatusCode >= 300
	m := fileMeta{
		Commit:   h.Get("X-Repo-Commit"),
		ETag:     normalizeETag(firstNonEmpty(h.Get("X-Linked-Etag"), h.Get("ETag"))),
		Size:     -1,
		Location: resp.Request.URL.String(),
	}
	if redirected {
		// send already checked that Location parses.
		loc, err := resp.Request.URL.Parse(h.Get("Location"))
		if err != nil {
			return fileMeta{}, protocolError(t, "bad redirect: %v", err)
		}
		m.Location = loc.String()
	}
	sizeHeader := h.Get("X-Linked-Size")
	if sizeHeader == "" && !redirected {
		sizeHeader = h.Get("Content-Length")
	}
	if n, err := strconv.ParseInt(sizeHeader, 10, 64); err == nil && n >= 0 {
		m.Size = n
	}
	if m.Commit == "" {
		return fileMeta{}, protocolError(t, "the answer from %s has no X-Repo-Commit header; is HF_ENDPOINT (%s) a Hugging Face Hub?", resp.Request.URL.Redacted(), c.endpoint())
	}
	if !IsCommitHash(m.Commit) {
		return fileMeta{}, protocolError(t, "X-Repo-Commit %q is not a commit hash", m.Commit)
	}
	if m.ETag == "" {
		return fileMeta{}, protocolError(t, "the Hub sent no ETag, so the file cannot be cached reliably")
	}
	if err := validateETag(m.ETag); err != nil {
		return fileMeta{}, protocolError(t, "%v", err)
	}
	return m, nil
}

package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// RepoInfo is what the Hub's model API says about one revision of a repository.
type RepoInfo struct {
	ID string `json:"id"`
	// SHA is the commit the revision resolved to.
	SHA      string    `json:"sha"`
	Private  bool      `json:"private"`
	Siblings []Sibling `json:"siblings"`
}

// Sibling is one file of the revision.
type Sibling struct {
	// RFilename is the path inside the repository, with forward slashes.
	RFilename string `json:"rfilename"`
	// Size is the file's size (of the content, also for LFS files); nil when not reported.
	Size   *int64   `json:"size,omitempty"`
	BlobID string   `json:"blobId,omitempty"`
	LFS    *LFSInfo `json:"lfs,omitempty"`
}

// LFSInfo describes a file stored with Git LFS.
type LFSInfo struct {
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	PointerSize int64  `json:"pointerSize"`
}

// size returns the content size of a sibling, or -1 when the listing does not say.
func (s Sibling) size() int64 {
	switch {
	case s.LFS != nil:
		return s.LFS.Size
	case s.Size != nil:
		return *s.Size
	}
	return -1
}

// maxInfoBytes bounds the repository listing we are willing to parse.
const maxInfoBytes = 64 << 20

// RepoInfo asks the Hub which commit revision ("" for main) points at and which files it holds:
// GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true.
func (c *Client) RepoInfo(ctx context.Context, repoID, revision string) (*RepoInfo, error) {
	if revision == "" {
		revision = DefaultRevision
	}
	t := target{repoID: repoID, revision: revision}
	if err := ValidateRepoID(repoID); err != nil {
		return nil, err
	}
	if err := validateRevision(revision); err != nil {
		return nil, err
	}
	if c.Offline {
		return nil, &Error{Kind: ErrNotCached, RepoID: repoID, Revision: revision,
			Msg: fmt.Sprintf("hub: %s: cannot list files in offline mode (HF_HUB_OFFLINE=1)", t)}
	}
	u := c.endpoint() + "/api/models/" + repoID + "/revision/" + url.PathEscape(revision) + "?blobs=true"
	resp, err := c.send(ctx, http.MethodGet, u, http.Header{"Accept": {"application/json"}}, false)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, c.httpError(t, resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxInfoBytes))
	if err != nil {
		return nil, fmt.Errorf("hub: %s: reading repository info: %w", t, err)
	}
	var info RepoInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, protocolError(t, "repository info is not valid JSON: %v", err)
	}
	if !IsCommitHash(info.SHA) {
		return nil, protocolError(t, "repository info has no commit hash (sha=%q)", info.SHA)
	}
	for _, s := range info.Siblings {
		if err := validateRepoPath(s.RFilename); err != nil {
			return nil, err
		}
	}
	return &info, nil
}

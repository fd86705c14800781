package hub

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultRevision is the branch used when no revision is given.
const DefaultRevision = "main"

var (
	commitHashRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sha256HexRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	repoPartRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// IsCommitHash reports whether rev is a full commit hash (the only revision that never moves).
func IsCommitHash(rev string) bool { return commitHashRE.MatchString(rev) }

// ValidateRepoID checks a model repository ID: "org/name", or a bare legacy "name".
// Names are checked strictly because they become folder names in the cache.
func ValidateRepoID(id string) error {
	parts := strings.Split(id, "/")
	if len(parts) > 2 {
		return fmt.Errorf("hub: invalid repository ID %q: want org/name", id)
	}
	for _, p := range parts {
		if !repoPartRE.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") || len(p) > 96 {
			return fmt.Errorf("hub: invalid repository ID %q: names use letters, digits, '-', '_' and '.', without '--' or '..'", id)
		}
	}
	return nil
}

// validateRevision rejects revisions that would escape the refs folder when stored as refs/{rev}.
func validateRevision(rev string) error {
	if rev == "" || strings.HasPrefix(rev, "/") || strings.ContainsAny(rev, "\\\x00") {
		return fmt.Errorf("hub: invalid revision %q", rev)
	}
	for _, seg := range strings.Split(rev, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("hub: invalid revision %q", rev)
		}
	}
	return nil
}

// validateRepoPath rejects repository file names that would land outside the snapshot folder
// (absolute paths, drive letters, '..' segments), whatever the server sends.
func validateRepoPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.ContainsAny(p, "\\\x00") || (len(p) >= 2 && p[1] == ':') {
		return fmt.Errorf("hub: unsafe file name %q in repository", p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("hub: unsafe file name %q in repository", p)
		}
	}
	return nil
}

// validateETag makes sure an ETag can be used as a blob file name.
func validateETag(etag string) error {
	if etag == "" || etag == "." || etag == ".." || strings.ContainsAny(etag, "/\\\x00") || len(etag) > 200 {
		return fmt.Errorf("hub: unusable ETag %q", etag)
	}
	return nil
}

// normalizeETag strips the weak marker and the quotes of an ETag header.
func normalizeETag(h string) string {
	return strings.Trim(strings.TrimPrefix(strings.TrimSpace(h), "W/"), `"`)
}

// RepoFolderName is the cache folder of a model repository: "models--org--name".
func RepoFolderName(repoID string) string {
	return "models--" + strings.ReplaceAll(repoID, "/", "--")
}

// repoIDFromFolder reverses RepoFolderName; ok is false for folders that are not model repos.
func repoIDFromFolder(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "models--")
	if !ok || rest == "" {
		return "", false
	}
	return strings.ReplaceAll(rest, "--", "/"), true
}

package hubtest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
)

// Access says who may read a repository.
type Access int

const (
	// Public repositories are readable without a token.
	Public Access = iota
	// Private repositories are readable only with a token that was granted access (Repo.Grant).
	Private
	// Gated repositories need a token whose account accepted the license (Repo.Grant).
	Gated
)

// File is one file of a commit.
type File struct {
	Path string
	Data []byte
	// LFS files are stored as Git LFS pointers: the Hub redirects their downloads to the CDN and
	// identifies them by the sha256 of their content.
	LFS bool
}

// LFSIfWeights returns files with LFS set for *.safetensors, as on real model repositories.
func LFSIfWeights(files ...File) []File {
	out := make([]File, len(files))
	for i, f := range files {
		f.LFS = f.LFS || strings.HasSuffix(f.Path, ".safetensors")
		out[i] = f
	}
	return out
}

// storedFile is a File with the identifiers the Hub derives from it.
type storedFile struct {
	File
	// BlobID is the git object ID of what git stores: the content, or the LFS pointer for LFS files.
	BlobID string
	// SHA256 is the sha256 of the content (set for LFS files only, as on the Hub).
	SHA256 string
	// PointerSize is the size of the LFS pointer file.
	PointerSize int
}

func newStoredFile(f File) *storedFile {
	sf := &storedFile{File: f}
	if !f.LFS {
		sf.BlobID = gitBlobID(f.Data)
		return sf
	}
	sum := sha256.Sum256(f.Data)
	sf.SHA256 = hex.EncodeToString(sum[:])
	pointer := fmt.Sprintf("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", sf.SHA256, len(f.Data))
	sf.BlobID = gitBlobID([]byte(pointer))
	sf.PointerSize = len(pointer)
	return sf
}

// etag is what the Hub's resolve endpoint puts in ETag: the git blob ID.
func (f *storedFile) etag() string { return f.BlobID }

// gitBlobID is git's object ID of a blob: sha1("blob <len>\0" + data).
func gitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

type commit struct {
	SHA   string
	Files map[string]*storedFile
}

// Repo is a model repository on the fake Hub. Its methods are safe for concurrent use with the server.
type Repo struct {
	s       *Server
	id      string
	access  Access
	granted map[string]bool
	commits map[string]*commit
	refs    map[string]string // branch or tag name -> commit SHA
	serial  int
}

// ID is the repository ID ("org/name").
func (r *Repo) ID() string { return r.id }

// Commit records a commit containing exactly files on branch (created if new) and returns its SHA.
func (r *Repo) Commit(branch string, files ...File) string {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.serial++
	c := &commit{Files: map[string]*storedFile{}}
	h := sha1.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00", r.id, branch, r.serial)
	for _, f := range files {
		sf := newStoredFile(f)
		c.Files[f.Path] = sf
		fmt.Fprintf(h, "%s\x00%s\x00", f.Path, sf.BlobID)
	}
	c.SHA = hex.EncodeToString(h.Sum(nil))
	r.commits[c.SHA] = c
	r.refs[branch] = c.SHA
	return c.SHA
}

// Tag points name (a tag, or any ref name such as "refs/pr/1") at an existing commit.
func (r *Repo) Tag(name, sha string) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if _, ok := r.commits[sha]; !ok {
		panic(fmt.Sprintf("hubtest: Tag(%q): no commit %s in %s", name, sha, r.id))
	}
	r.refs[name] = sha
}

// Grant gives token read access to a private repository, or accepts a gated repository's license
// for the token's account. The token must also be known to the server (Server.AddToken).
func (r *Repo) Grant(token string) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	r.granted[token] = true
}

// resolveRevision finds the commit for a branch, tag or full commit SHA. Callers hold s.mu.
func (r *Repo) resolveRevision(rev string) *commit {
	if sha, ok := r.refs[rev]; ok {
		return r.commits[sha]
	}
	return r.commits[rev]
}

// sortedPaths lists a commit's files in a stable order.
func (c *commit) sortedPaths() []string {
	paths := make([]string, 0, len(c.Files))
	for p := range c.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

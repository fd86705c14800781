package prefixcache

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// The entry file: magic, format version (uint32 LE), header length (uint32 LE), the
// header (JSON), the arrays' bytes in header order, and the SHA-256 of everything before
// it. A file is written to a temporary name, synced and renamed, so a reader sees a whole
// file or none; any changed byte fails the checksum.
const (
	fileMagic   = "DFLASHPC"
	fileVersion = 1
	fileExt     = ".dfpc"
	tmpPrefix   = ".tmp-"
	// staleTmp is the age past which a temporary file is a write that died (removed at
	// open); a younger one may be another process's write in progress.
	staleTmp = time.Hour
)

// DefaultDiskBudget bounds a cache directory's entries when none is given: 16 GiB.
const DefaultDiskBudget int64 = 16 << 30

// Disk is a directory of entries for one key (target, drafter, weights and the settings
// that change numerics): entries of other keys live in other subdirectories.
type Disk struct {
	dir    string
	key    string
	budget int64

	mu      sync.Mutex
	entries map[string]*diskEntry // by path
	// writeHook, when set (tests), is called after each chunk written to a temporary file.
	writeHook func(written int64)
}

// diskEntry is what an entry's header tells before its arrays are read.
type diskEntry struct {
	path     string
	tokens   []int32
	draft    bool
	resumeAt func(limit int) int
	size     int64
	modTime  time.Time
}

// fileHeader is the JSON header of an entry file.
type fileHeader struct {
	Key    string       `json:"key"`
	Tokens []int32      `json:"tokens"`
	Target []savedLayer `json:"target"`
	Draft  []savedLayer `json:"draft,omitempty"`
	Marks  []savedMark  `json:"marks,omitempty"`
}

type savedMark struct {
	Pos    int          `json:"pos"`
	Target []savedLayer `json:"target"`
}

type savedLayer struct {
	Kind      string       `json:"kind,omitempty"`
	Offset    int          `json:"offset"`
	Trimmable bool         `json:"trimmable,omitempty"`
	Arrays    []savedArray `json:"arrays,omitempty"`
}

type savedArray struct {
	Dtype string `json:"dtype"`
	Shape []int  `json:"shape"`
	Bytes int64  `json:"bytes"`
}

// OpenDisk opens (creating) the directory of key's entries under root, reading every
// entry's header; budget bounds their bytes (0: DefaultDiskBudget), the oldest removed
// first. Unreadable entries are reported through warn and removed.
func OpenDisk(root, key string, budget int64, warn func(string)) (*Disk, error) {
	if budget < 0 {
		return nil, fmt.Errorf("prefix cache: disk budget %d bytes is negative", budget)
	}
	if budget == 0 {
		budget = DefaultDiskBudget
	}
	if warn == nil {
		warn = func(string) {}
	}
	sum := sha256.Sum256([]byte(key))
	dir := filepath.Join(root, fmt.Sprintf("v%d", fileVersion), hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("prefix cache: %w", err)
	}
	d := &Disk{dir: dir, key: key, budget: budget, entries: map[string]*diskEntry{}}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("prefix cache: %w", err)
	}
	for _, n := range names {
		p := filepath.Join(dir, n.Name())
		switch {
		case strings.HasPrefix(n.Name(), tmpPrefix):
			if info, err := n.Info(); err == nil && time.Since(info.ModTime()) > staleTmp {
				os.Remove(p)
			}
		case strings.HasSuffix(n.Name(), fileExt):
			de, err := d.index(p)
			if err != nil {
				warn(fmt.Sprintf("prefix cache: %v (removed)", err))
				os.Remove(p)
				continue
			}
			d.entries[p] = de
		}
	}
	return d, nil
}

// Dir is the directory of the key's entries.
func (d *Disk) Dir() string { return d.dir }

// Entries is the number of entries on disk.
func (d *Disk) Entries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries)
}

// index reads and checks a whole file (its checksum, version and key) and keeps what its
// header says.
func (d *Disk) index(path string) (*diskEntry, error) {
	h, _, info, err := d.load(path)
	if err != nil {
		return nil, err
	}
	return d.describe(path, h, info), nil
}

func (d *Disk) describe(path string, h *fileHeader, info os.FileInfo) *diskEntry {
	e := &Entry{Tokens: h.Tokens}
	for _, l := range h.Target {
		e.Target = append(e.Target, cache.Saved{Kind: l.Kind, Offset: l.Offset, Trimmable: l.Trimmable})
	}
	for _, m := range h.Marks {
		e.Marks = append(e.Marks, Mark{Pos: m.Pos})
	}
	return &diskEntry{path: path, tokens: h.Tokens, draft: h.Draft != nil, resumeAt: e.resumeAt,
		size: info.Size(), modTime: info.ModTime()}
}

// load reads path whole and checks it: the magic, the version, the checksum, the header
// and the key. It returns the header and the arrays' bytes.
func (d *Disk) load(path string) (*fileHeader, []byte, os.FileInfo, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("prefix cache entry %s: %w", path, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("prefix cache entry %s: %w", path, err)
	}
	bad := func(why string, a ...any) error {
		return fmt.Errorf("prefix cache entry %s: %s", path, fmt.Sprintf(why, a...))
	}
	const fixed = len(fileMagic) + 8
	if len(b) < fixed+sha256.Size || string(b[:len(fileMagic)]) != fileMagic {
		return nil, nil, nil, bad("not an entry file")
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, nil, nil, bad("checksum mismatch (a damaged or partly written file)")
	}
	if v := binary.LittleEndian.Uint32(b[len(fileMagic):]); v != fileVersion {
		return nil, nil, nil, bad("format version %d, this build reads %d", v, fileVersion)
	}
	hl := int(binary.LittleEndian.Uint32(b[len(fileMagic)+4:]))
	if hl > len(body)-fixed {
		return nil, nil, nil, bad("header length %d past the end", hl)
	}
	var h fileHeader
	if err := json.Unmarshal(body[fixed:fixed+hl], &h); err != nil {
		return nil, nil, nil, bad("header: %v", err)
	}
	if h.Key != d.key {
		return nil, nil, nil, bad("made for another model or settings")
	}
	data := body[fixed+hl:]
	var need int64
	for _, l := range h.layers() {
		for _, a := range l.Arrays {
			need += a.Bytes
		}
	}
	if need != int64(len(data)) {
		return nil, nil, nil, bad("arrays need %d bytes, the file has %d", need, len(data))
	}
	return &h, data, info, nil
}

// layers lists every saved layer of the header in file order.
func (h *fileHeader) layers() []savedLayer {
	out := append(append([]savedLayer(nil), h.Target...), h.Draft...)
	for _, m := range h.Marks {
		out = append(out, m.Target...)
	}
	return out
}

// best is the entry on disk resuming the longest prefix of prompt (at most limit).
func (d *Disk) best(prompt []int32, limit int, needDraft bool) (*diskEntry, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *diskEntry
	n := 0
	for _, e := range d.entries {
		if needDraft && !e.draft {
			continue
		}
		if k := e.resumeAt(min(limit, commonPrefix(e.tokens, prompt))); k > n {
			best, n = e, k
		}
	}
	return best, n
}

// read loads an entry's arrays (evaluated). A file that fails its checks is removed.
func (d *Disk) read(de *diskEntry) (*Entry, error) {
	h, data, _, err := d.load(de.path)
	if err != nil {
		d.drop(de.path)
		return nil, err
	}
	e := &Entry{Tokens: h.Tokens}
	var ferr error
	if err := mlxc.Catch(func() {
		// A failure half way leaves the arrays made so far in the scope, which frees them.
		sc := mlxc.NewScope()
		defer sc.Close()
		take := func(ls []savedLayer) []cache.Saved {
			out := make([]cache.Saved, len(ls))
			for i, l := range ls {
				out[i] = cache.Saved{Kind: l.Kind, Offset: l.Offset, Trimmable: l.Trimmable}
				for _, a := range l.Arrays {
					dt, err := mlxc.ParseDtype(a.Dtype)
					if err != nil || a.Bytes > int64(len(data)) {
						panic(&mlxc.Error{Op: "prefixcache.read", Msg: fmt.Sprintf("array %s %v unreadable", a.Dtype, a.Shape)})
					}
					out[i].Arrays = append(out[i].Arrays, mlxc.FromBytes(data[:a.Bytes], a.Shape, dt))
					data = data[a.Bytes:]
				}
			}
			return out
		}
		t := take(h.Target)
		var dr []cache.Saved
		if h.Draft != nil {
			dr = take(h.Draft)
		}
		var marks []Mark
		for _, m := range h.Marks {
			marks = append(marks, Mark{Pos: m.Pos, Target: take(m.Target)})
		}
		e.Target, e.Draft, e.Marks = t, dr, marks
		e.Eval()
		e.detach()
	}); err != nil {
		e.Target, e.Draft, e.Marks = nil, nil, nil // freed with the scope
		ferr = fmt.Errorf("prefix cache entry %s: %w", de.path, err)
	}
	if ferr == nil && !e.consistent() {
		ferr = fmt.Errorf("prefix cache entry %s: layers do not agree with its tokens", de.path)
	}
	if ferr != nil {
		e.free()
		d.drop(de.path)
		return nil, ferr
	}
	os.Chtimes(de.path, time.Now(), time.Now()) // recently used: evicted last
	return e, nil
}

// consistent reports whether the entry's layers hold its token count (and its marks'
// positions), and its marks lie inside it.
func (e *Entry) consistent() bool {
	n := len(e.Tokens)
	for _, s := range append(append([]cache.Saved(nil), e.Target...), e.Draft...) {
		if s.Offset != n {
			return false
		}
	}
	for _, m := range e.Marks {
		if m.Pos <= 0 || m.Pos >= n || len(m.Target) != len(e.Target) {
			return false
		}
		for i, s := range m.Target {
			if !e.Target[i].Trimmable && s.Offset != m.Pos {
				return false
			}
		}
	}
	return true
}

// drop removes an entry file and forgets it.
func (d *Disk) drop(path string) {
	d.mu.Lock()
	delete(d.entries, path)
	d.mu.Unlock()
	os.Remove(path)
}

// pathFor names the file of an entry: the hash of its tokens (an entry for the same
// tokens replaces the older one).
func (d *Disk) pathFor(tokens []int32) string {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, tokens)
	return filepath.Join(d.dir, fmt.Sprintf("%08d-%s%s", len(tokens), hex.EncodeToString(h.Sum(nil)[:12]), fileExt))
}

// write stores e atomically (a temporary file synced, then renamed), removes the files
// of entries it covers, and keeps the directory within its budget.
func (d *Disk) write(e *Entry) error {
	h := fileHeader{Key: d.key, Tokens: e.Tokens}
	var arrays []*mlxc.Array
	desc := func(ss []cache.Saved) []savedLayer {
		out := make([]savedLayer, len(ss))
		for i, s := range ss {
			out[i] = savedLayer{Kind: s.Kind, Offset: s.Offset, Trimmable: s.Trimmable}
			for _, a := range s.Arrays {
				out[i].Arrays = append(out[i].Arrays, savedArray{Dtype: a.Dtype().String(), Shape: a.Shape(), Bytes: int64(a.NBytes())})
				arrays = append(arrays, a)
			}
		}
		return out
	}
	h.Target = desc(e.Target)
	if e.Draft != nil {
		h.Draft = desc(e.Draft)
	}
	for _, m := range e.Marks {
		h.Marks = append(h.Marks, savedMark{Pos: m.Pos, Target: desc(m.Target)})
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return err
	}
	final := d.pathFor(e.Tokens)
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(d.dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	sum := sha256.New()
	w := &hookWriter{w: io.MultiWriter(f, sum), hook: d.writeHook}
	var fixed [8]byte
	binary.LittleEndian.PutUint32(fixed[:4], fileVersion)
	binary.LittleEndian.PutUint32(fixed[4:], uint32(len(hj)))
	if _, err := w.Write(append(append([]byte(fileMagic), fixed[:]...), hj...)); err != nil {
		return err
	}
	for _, a := range arrays {
		if _, err := w.Write(a.Bytes()); err != nil {
			return err
		}
	}
	if _, err := f.Write(sum.Sum(nil)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	ok = true
	syncDir(d.dir)
	info, err := os.Stat(final)
	if err != nil {
		return err
	}
	de := d.describe(final, &h, info)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries[final] = de
	e.onDisk = final
	// Entries whose tokens e extends are covered by it (their recurrent states are marks
	// of e): their files go.
	for p, x := range d.entries {
		if p != final && isPrefix(x.tokens, e.Tokens) && (!x.draft || de.draft) && e.stateAt(len(x.tokens)) != nil {
			delete(d.entries, p)
			os.Remove(p)
		}
	}
	d.trim()
	return nil
}

// trim removes the least recently used files until the entries fit the budget; d.mu is
// held.
func (d *Disk) trim() {
	var total int64
	all := make([]*diskEntry, 0, len(d.entries))
	for _, e := range d.entries {
		total += e.size
		all = append(all, e)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].modTime.Before(all[j].modTime) })
	for _, e := range all {
		if total <= d.budget {
			break
		}
		delete(d.entries, e.path)
		os.Remove(e.path)
		total -= e.size
	}
}

// syncDir makes a rename durable (best effort: not every system syncs directories).
func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		f.Sync()
		f.Close()
	}
}

// hookWriter writes through w, calling hook with the bytes written so far.
type hookWriter struct {
	w    io.Writer
	hook func(int64)
	n    int64
}

func (h *hookWriter) Write(p []byte) (int, error) {
	const chunk = 1 << 20
	written := 0
	for len(p) > 0 {
		k := min(len(p), chunk)
		n, err := h.w.Write(p[:k])
		written += n
		h.n += int64(n)
		if err != nil {
			return written, err
		}
		if h.hook != nil {
			h.hook(h.n)
		}
		p = p[k:]
	}
	return written, nil
}

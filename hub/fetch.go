package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxFailuresWithoutProgress bounds retries of a transfer that keeps failing without receiving
// anything; a failure after some progress resets the count, as huggingface_hub does.
const maxFailuresWithoutProgress = 5

var errStalled = errors.New("no data received within the stall timeout")

// transient marks a failure worth retrying with a Range request.
type transient struct{ err error }

func (t transient) Error() string { return t.err.Error() }
func (t transient) Unwrap() error { return t.err }

// fetchBlob downloads meta's content into the blob named by meta.ETag. The caller holds the blob's
// lock. Bytes go to blobs/{etag}.incomplete first, which an interrupted download leaves behind so
// that the next attempt (in this process or another) resumes with a Range request; only a complete,
// verified, fsynced file is renamed to blobs/{etag}. onBytes reports progress (negative when bytes
// already counted are thrown away).
func (c *Client) fetchBlob(ctx context.Context, t target, rc repoCache, meta fileMeta, onBytes func(int64)) error {
	blob := rc.blobPath(meta.ETag)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return fmt.Errorf("hub: creating blobs folder: %w", err)
	}
	partialPath := rc.incompletePath(meta.ETag)
	f, err := os.OpenFile(partialPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("hub: opening %s: %w", partialPath, err)
	}
	p, err := resumePartial(f, sha256HexRE.MatchString(meta.ETag), meta.Size, onBytes)
	if err != nil {
		f.Close()
		return fmt.Errorf("hub: %s: resuming %s: %w", t, partialPath, err)
	}

	failures := 0
	for {
		progressed, err := c.fetchOnce(ctx, t, meta, p)
		if err == nil {
			break
		}
		var tr transient
		if ctx.Err() != nil || !errors.As(err, &tr) {
			f.Close()
			return err
		}
		if progressed {
			failures = 0
		}
		if failures++; failures >= maxFailuresWithoutProgress {
			f.Close()
			return fmt.Errorf("hub: %s: giving up after %d failed attempts: %w", t, failures, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return fmt.Errorf("hub: %s: %w", t, context.Cause(ctx))
		case <-time.After(time.Duration(failures) * 100 * time.Millisecond):
		}
	}

	if err := p.verify(t, meta); err != nil {
		f.Close()
		// The bytes are wrong, so resuming from them would only repeat the failure.
		os.Remove(partialPath)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("hub: flushing %s: %w", partialPath, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("hub: closing %s: %w", partialPath, err)
	}
	if err := os.Rename(partialPath, blob); err != nil {
		return fmt.Errorf("hub: placing blob %s: %w", blob, err)
	}
	return syncDir(filepath.Dir(blob))
}

// fetchOnce makes one GET for the bytes still missing and appends what arrives. progressed says
// whether any byte was received.
func (c *Client) fetchOnce(ctx context.Context, t target, meta fileMeta, p *partialBlob) (progressed bool, err error) {
	if meta.Size >= 0 && p.size == meta.Size {
		return false, nil
	}
	hdr := http.Header{}
	if p.size > 0 {
		hdr.Set("Range", fmt.Sprintf("bytes=%d-", p.size))
	}
	reqCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	resp, err := c.send(reqCtx, http.MethodGet, meta.Location, hdr, true)
	if err != nil {
		if ctx.Err() != nil {
			return false, err
		}
		return false, transient{err}
	}
	defer resp.Body.Close()

	switch resp.StatusCode {
	case http.StatusOK:
		if p.size > 0 {
			// The server ignored the Range header and sends everything again.
			if err := p.reset(); err != nil {
				return false, err
			}
		}
	case http.StatusPartialContent:
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || start != p.size {
			if err := p.reset(); err != nil {
				return false, err
			}
			return false, transient{protocolError(t, "asked for bytes from %d, got Content-Range %q", p.size, resp.Header.Get("Content-Range"))}
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// What we have is not a prefix of the file (or is all of it, when the size was unknown).
		if total, ok := contentRangeTotal(resp.Header.Get("Content-Range")); ok && total == p.size {
			return false, nil
		}
		if err := p.reset(); err != nil {
			return false, err
		}
		return false, transient{protocolError(t, "the server refused to resume at byte %d", p.size)}
	default:
		herr := c.httpError(t, resp)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests {
			return false, transient{herr}
		}
		return false, herr
	}

	timeout := c.StallTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	watchdog := time.AfterFunc(timeout, func() { cancel(errStalled) })
	defer watchdog.Stop()
	body := &stallGuard{r: resp.Body, timer: watchdog, timeout: timeout}
	n, err := io.CopyBuffer(p, body, make([]byte, 1<<20))
	if err == nil {
		return n > 0, nil
	}
	if ctx.Err() != nil {
		return n > 0, fmt.Errorf("hub: %s: %w", t, context.Cause(ctx))
	}
	if errors.Is(context.Cause(reqCtx), errStalled) {
		return n > 0, transient{fmt.Errorf("hub: %s: %w", t, errStalled)}
	}
	if isTransientIO(err) {
		return n > 0, transient{fmt.Errorf("hub: %s: transfer interrupted after %d bytes: %w", t, p.size, err)}
	}
	return n > 0, err
}

// isTransientIO reports network failures in mid-transfer, after which a Range request can resume.
func isTransientIO(err error) bool {
	var ne net.Error
	var wf writeFailure
	switch {
	case errors.As(err, &wf):
		return false // a local disk problem, not a network one
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &ne):
		return true
	}
	return false
}

// stallGuard re-arms the watchdog timer whenever data arrives.
type stallGuard struct {
	r       io.Reader
	timer   *time.Timer
	timeout time.Duration
}

func (s *stallGuard) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if n > 0 {
		s.timer.Reset(s.timeout)
	}
	return n, err
}

// partialBlob is the .incomplete file of a blob being downloaded, with a running sha256 of its
// bytes when the ETag is a sha256 (LFS files), so verifying costs no second read.
type partialBlob struct {
	f       *os.File
	size    int64
	hash    hash.Hash
	onBytes func(int64)
}

// writeFailure marks local write errors so they are not mistaken for network failures.
type writeFailure struct{ err error }

func (w writeFailure) Error() string { return w.err.Error() }
func (w writeFailure) Unwrap() error { return w.err }

// resumePartial takes over what an earlier attempt left in f: it hashes the existing bytes, or
// starts over when there are more of them than the file has.
func resumePartial(f *os.File, withHash bool, expected int64, onBytes func(int64)) (*partialBlob, error) {
	p := &partialBlob{f: f, onBytes: onBytes}
	if withHash {
		p.hash = sha256.New()
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if expected >= 0 && fi.Size() > expected {
		return p, p.truncate()
	}
	if p.hash != nil && fi.Size() > 0 {
		if _, err := io.Copy(p.hash, io.NewSectionReader(f, 0, fi.Size())); err != nil {
			return nil, err
		}
	}
	p.size = fi.Size()
	onBytes(p.size)
	return p, nil
}

func (p *partialBlob) Write(b []byte) (int, error) {
	n, err := p.f.WriteAt(b, p.size)
	if p.hash != nil {
		p.hash.Write(b[:n])
	}
	p.size += int64(n)
	p.onBytes(int64(n))
	if err != nil {
		return n, writeFailure{err}
	}
	return n, nil
}

// reset throws the bytes away (they were counted as progress, so they are uncounted).
func (p *partialBlob) reset() error {
	p.onBytes(-p.size)
	return p.truncate()
}

func (p *partialBlob) truncate() error {
	if err := p.f.Truncate(0); err != nil {
		return fmt.Errorf("hub: truncating %s: %w", p.f.Name(), err)
	}
	p.size = 0
	if p.hash != nil {
		p.hash.Reset()
	}
	return nil
}

// verify checks the finished file against the size and, for LFS files, the sha256 the Hub announced.
func (p *partialBlob) verify(t target, meta fileMeta) error {
	if meta.Size >= 0 && p.size != meta.Size {
		return &Error{Kind: ErrIntegrity, RepoID: t.repoID, Revision: t.revision, File: t.file,
			Msg: fmt.Sprintf("hub: %s: downloaded %d bytes, the Hub announced %d", t, p.size, meta.Size)}
	}
	if p.hash != nil {
		if got := hex.EncodeToString(p.hash.Sum(nil)); got != meta.ETag {
			return &Error{Kind: ErrIntegrity, RepoID: t.repoID, Revision: t.revision, File: t.file,
				Msg: fmt.Sprintf("hub: %s: sha256 of the download is %s, the Hub announced %s", t, got, meta.ETag)}
		}
	}
	return nil
}

// contentRangeStart reads N from "bytes N-M/T".
func contentRangeStart(h string) (int64, bool) {
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}

// contentRangeTotal reads T from "bytes N-M/T" or "bytes */T".
func contentRangeTotal(h string) (int64, bool) {
	_, total, ok := strings.Cut(h, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(total, 10, 64)
	return n, err == nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("hub: opening %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("hub: syncing %s: %w", dir, err)
	}
	return nil
}

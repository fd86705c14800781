package hub

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// kind is a category of failure; callers test for one with errors.Is.
type kind struct {
	name   string
	parent error
}

func (k *kind) Error() string { return k.name }
func (k *kind) Unwrap() error { return k.parent }

// Categories of errors returned by this package (test with errors.Is).
var (
	// ErrUnauthorized: HTTP 401. The repository needs a token, or the token was rejected.
	ErrUnauthorized error = &kind{name: "hub: unauthorized"}
	// ErrGated: the repository is gated and this account has not accepted its license (HTTP 403,
	// or 401 without a token; the latter also matches ErrUnauthorized).
	ErrGated error = &kind{name: "hub: gated repository"}
	// ErrForbidden: HTTP 403 for another reason than gating.
	ErrForbidden error = &kind{name: "hub: forbidden"}
	// ErrNotFound: a repository, revision or file does not exist (each has its own kind below).
	ErrNotFound error = &kind{name: "hub: not found"}
	// ErrRepoNotFound: the repository does not exist (or is private and invisible to this token).
	ErrRepoNotFound error = &kind{name: "hub: repository not found", parent: ErrNotFound}
	// ErrRevisionNotFound: the repository exists but the branch, tag or commit does not.
	ErrRevisionNotFound error = &kind{name: "hub: revision not found", parent: ErrNotFound}
	// ErrEntryNotFound: the revision exists but the file does not.
	ErrEntryNotFound error = &kind{name: "hub: file not found", parent: ErrNotFound}
	// ErrUnreachable: the endpoint could not be contacted (DNS, refused, TLS, timeout).
	ErrUnreachable error = &kind{name: "hub: endpoint unreachable"}
	// ErrNotCached: offline, and what was asked for is not in the cache.
	ErrNotCached error = &kind{name: "hub: not in the cache"}
	// ErrIntegrity: a downloaded file does not have the size or sha256 the Hub announced.
	ErrIntegrity error = &kind{name: "hub: download failed verification"}
	// ErrProtocol: the server answered something a Hub would not (missing headers, bad JSON, 5xx).
	ErrProtocol error = &kind{name: "hub: unexpected answer from the Hub"}
)

// Error describes a failed Hub operation. Its message says what to do about it; Kind (and, for a
// gated repository, ErrGated) can be tested with errors.Is, and the cause, if any, is wrapped.
type Error struct {
	Kind     error
	RepoID   string
	Revision string
	File     string
	// Status is the HTTP status code, 0 when the failure was not an HTTP answer.
	Status int
	// Code is the Hub's X-Error-Code header (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound).
	Code string
	// Msg is the full human-readable explanation, cause included.
	Msg string
	// Err is the underlying cause, when there is one.
	Err error
}

// Error returns the explanation; it already includes what matters of the cause.
func (e *Error) Error() string { return e.Msg }

// Unwrap exposes the kind, ErrGated for gated repositories answered with 401, and the cause.
func (e *Error) Unwrap() []error {
	errs := []error{e.Kind}
	if e.Code == "GatedRepo" && e.Kind != ErrGated {
		errs = append(errs, ErrGated)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// target names what a request was about, for messages: "org/name", "org/name@rev", "org/name@rev: file".
type target struct {
	repoID, revision, file string
}

func (t target) String() string {
	s := t.repoID
	if t.revision != "" {
		s += "@" + t.revision
	}
	if t.file != "" {
		s += ": " + t.file
	}
	return s
}

// httpError turns an error answer of the Hub into an *Error with a message that says what to do.
func (c *Client) httpError(t target, resp *http.Response) *Error {
	code := resp.Header.Get("X-Error-Code")
	detail := serverMessage(resp)
	e := &Error{RepoID: t.repoID, Revision: t.revision, File: t.file, Status: resp.StatusCode, Code: code}
	repoURL := c.endpoint() + "/" + t.repoID
	switch {
	case resp.StatusCode == http.StatusUnauthorized && detail == "Invalid credentials in Authorization header":
		e.Kind = ErrUnauthorized
		e.Msg = fmt.Sprintf("hub: %s: the Hub rejected the token (invalid credentials); check HF_TOKEN or the token file in HF_HOME", t)
	case resp.StatusCode == http.StatusUnauthorized && code == "GatedRepo":
		e.Kind = ErrUnauthorized
		e.Msg = fmt.Sprintf("hub: %s is a gated repository and needs a token: accept its license at %s, then set HF_TOKEN (or log in) with that account", t.repoID, repoURL)
	case resp.StatusCode == http.StatusUnauthorized:
		e.Kind = ErrUnauthorized
		if c.Token == "" {
			e.Msg = fmt.Sprintf("hub: %s: repository not found, or it is private and needs a token: check the name, or set HF_TOKEN", t)
		} else {
			e.Msg = fmt.Sprintf("hub: %s: authentication failed (HTTP 401): %s", t, detail)
		}
	case resp.StatusCode == http.StatusForbidden && code == "GatedRepo":
		e.Kind = ErrGated
		e.Msg = fmt.Sprintf("hub: %s is a gated repository and this account has not been granted access: accept its license at %s and try again", t.repoID, repoURL)
	case resp.StatusCode == http.StatusForbidden:
		e.Kind = ErrForbidden
		e.Msg = fmt.Sprintf("hub: %s: access forbidden (HTTP 403): %s", t, detail)
	case code == "RevisionNotFound":
		e.Kind = ErrRevisionNotFound
		e.Msg = fmt.Sprintf("hub: %s: revision %q not found", t.repoID, t.revision)
	case code == "EntryNotFound":
		e.Kind = ErrEntryNotFound
		e.Msg = fmt.Sprintf("hub: %s@%s: file %q not found", t.repoID, t.revision, t.file)
	case code == "RepoNotFound" || resp.StatusCode == http.StatusNotFound:
		e.Kind = ErrRepoNotFound
		e.Msg = fmt.Sprintf("hub: repository %s not found (check the name; private repositories need a token with access)", t.repoID)
	default:
		e.Kind = ErrProtocol
		e.Msg = fmt.Sprintf("hub: %s: %s answered HTTP %d: %s", t, resp.Request.URL.Redacted(), resp.StatusCode, detail)
	}
	return e
}

// serverMessage extracts the Hub's explanation: X-Error-Message, else {"error": ...}, else the body.
func serverMessage(resp *http.Response) string {
	if m := resp.Header.Get("X-Error-Message"); m != "" {
		return m
	}
	if resp.Body == nil {
		return http.StatusText(resp.StatusCode)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var j struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &j) == nil && j.Error != "" {
		return j.Error
	}
	if s := strings.TrimSpace(string(body)); s != "" {
		return s
	}
	return http.StatusText(resp.StatusCode)
}

// protocolError reports an answer a Hub would not give.
func protocolError(t target, format string, args ...any) *Error {
	return &Error{Kind: ErrProtocol, RepoID: t.repoID, Revision: t.revision, File: t.file,
		Msg: fmt.Sprintf("hub: %s: ", t) + fmt.Sprintf(format, args...)}
}

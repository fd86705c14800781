package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Client talks to a Hugging Face Hub and keeps files in the shared cache. The zero value is not
// usable; build one with NewClient or NewClientFromEnv, then adjust fields before first use.
type Client struct {
	// Endpoint is the Hub's base URL, e.g. https://huggingface.co.
	Endpoint string
	// CacheDir is the hub cache (HF_HUB_CACHE).
	CacheDir string
	// Token is sent as a bearer token to the endpoint (never to the CDN); "" sends none.
	Token string
	// Offline resolves everything from the cache and never touches the network.
	Offline bool
	// HTTPClient is used for every request; nil uses a client with connection timeouts that
	// honours the usual proxy variables. Its redirect policy is overridden: redirects are followed
	// here, so that the token never leaves the endpoint.
	HTTPClient *http.Client
	// UserAgent is sent with every request.
	UserAgent string
	// StallTimeout aborts (and then resumes) a transfer that receives nothing for this long.
	StallTimeout time.Duration

	httpOnce sync.Once
	hc       *http.Client
}

// NewClient returns a client configured from env.
func NewClient(env Env) *Client {
	return &Client{
		Endpoint:     env.Endpoint,
		CacheDir:     env.CacheDir,
		Token:        env.Token,
		Offline:      env.Offline,
		UserAgent:    fmt.Sprintf("dflash-mlx; go/%s", strings.TrimPrefix(runtime.Version(), "go")),
		StallTimeout: 30 * time.Second,
	}
}

// NewClientFromEnv returns a client configured from the process environment (see Env).
func NewClientFromEnv() (*Client, error) {
	env, err := LoadEnv()
	if err != nil {
		return nil, err
	}
	return NewClient(env), nil
}

// checkCacheDir refuses to work without a cache folder, rather than fill the working directory.
func (c *Client) checkCacheDir() error {
	if c.CacheDir == "" {
		return fmt.Errorf("hub: no cache folder configured (Client.CacheDir is empty)")
	}
	return nil
}

func (c *Client) endpoint() string {
	if c.Endpoint == "" {
		return DefaultEndpoint
	}
	return strings.TrimRight(c.Endpoint, "/")
}

// httpClient returns the HTTP client with automatic redirects turned off.
func (c *Client) httpClient() *http.Client {
	c.httpOnce.Do(func() {
		var hc http.Client
		if c.HTTPClient != nil {
			hc = *c.HTTPClient
		} else {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
			tr.TLSHandshakeTimeout = 10 * time.Second
			tr.ResponseHeaderTimeout = 30 * time.Second
			tr.MaxIdleConnsPerHost = 16
			hc.Transport = tr
		}
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		c.hc = &hc
	})
	return c.hc
}

const maxRedirects = 20

// send performs a request and follows redirects itself. Redirects within the same origin are always
// followed (the Hub uses relative ones for renamed repositories). A redirect to another origin (the
// CDN holding LFS files) is followed only when followOffOrigin is set, and never with the token;
// otherwise the redirect answer itself is returned, because for HEAD it carries the file's metadata.
// The caller closes the response body.
func (c *Client) send(ctx context.Context, method, rawURL string, extra http.Header, followOffOrigin bool) (*http.Response, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("hub: bad URL %q: %w", rawURL, err)
	}
	for range maxRedirects {
		req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
		if err != nil {
			return nil, fmt.Errorf("hub: building request: %w", err)
		}
		for k, v := range extra {
			req.Header[k] = v
		}
		if c.UserAgent != "" {
			req.Header.Set("User-Agent", c.UserAgent)
		}
		// Identity encoding: sizes, ranges and hashes are about the stored bytes, and Go would
		// otherwise ask for gzip and hide Content-Length.
		req.Header.Set("Accept-Encoding", "identity")
		if c.Token != "" && c.isEndpointOrigin(u) {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
		resp, err := c.httpClient().Do(req)
		if err != nil {
			return nil, c.transportError(ctx, u, err)
		}
		loc := resp.Header.Get("Location")
		if resp.StatusCode < 300 || resp.StatusCode > 399 || loc == "" {
			return resp, nil
		}
		next, err := u.Parse(loc)
		if err != nil {
			resp.Body.Close()
			return nil, fmt.Errorf("hub: %s answered a bad redirect %q: %w", u.Redacted(), loc, err)
		}
		if !sameOrigin(u, next) && !followOffOrigin {
			return resp, nil
		}
		drainClose(resp.Body)
		u = next
	}
	return nil, fmt.Errorf("hub: more than %d redirects from %s", maxRedirects, rawURL)
}

func (c *Client) isEndpointOrigin(u *url.URL) bool {
	ep, err := url.Parse(c.endpoint())
	return err == nil && sameOrigin(ep, u)
}

// sameOrigin compares scheme, host and port (with the scheme's default port filled in).
func sameOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		switch strings.ToLower(u.Scheme) {
		case "https":
			return "443"
		case "http":
			return "80"
		}
		return ""
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

// transportError classifies a failed request: cancellation stays cancellation; failing to connect
// becomes ErrUnreachable with advice; anything else is wrapped as is.
func (c *Client) transportError(ctx context.Context, u *url.URL, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("hub: %s: %w", u.Redacted(), context.Cause(ctx))
	}
	if isConnectError(err) {
		origin := u.Scheme + "://" + u.Host
		return &Error{Kind: ErrUnreachable, Err: err,
			Msg: fmt.Sprintf("hub: cannot reach %s: %v (set HF_HUB_OFFLINE=1 to use the cache)", origin, unwrapURLError(err))}
	}
	return fmt.Errorf("hub: %s: %w", u.Redacted(), err)
}

// isConnectError reports failures to establish a connection, as opposed to failures mid-transfer.
func isConnectError(err error) bool {
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH)
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// drainClose reads a little of an unwanted body so the connection can be reused, then closes it.
func drainClose(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	_ = body.Close()
}

// fileURL is the resolve URL of a file: {endpoint}/{repo}/resolve/{revision}/{path}. The revision
// is escaped as one segment ("refs/pr/1" becomes "refs%2Fpr%2F1"), the path segment by segment.
func (c *Client) fileURL(repoID, revision, repoPath string) string {
	segs := strings.Split(repoPath, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return c.endpoint() + "/" + repoID + "/resolve/" + url.PathEscape(revision) + "/" + strings.Join(segs, "/")
}

package server

import (
	"cmp"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Config holds the server's settings. The zero value of every field means "use the
// default" listed beside it, except Port, where 0 asks the system for a free port.
type Config struct {
	Host string // default 127.0.0.1: loopback only unless asked otherwise
	Port int    // 0: any free port (tests); the serve command sets its own default

	// ModelAliases are names accepted in "model" besides Backend.ModelID.
	ModelAliases []string

	// MaxQueue is how many requests may wait behind the running generations (default 32;
	// NoQueue for none, so that only the running generations are served). One more is
	// answered 429 with Retry-After.
	MaxQueue int

	// APIKey, when set, is required as "Authorization: Bearer <key>" on /v1/* and /metrics.
	APIKey string

	// DefaultMaxTokens is used when a request sets neither max_tokens nor
	// max_completion_tokens (default 4096), shortened to fit the context.
	DefaultMaxTokens int
	// MaxTokensLimit is the largest max_tokens a request may ask for (default: the context
	// length). Larger requests get a 400 naming the field.
	MaxTokensLimit int

	// DefaultTemperature applies when a request has no temperature (0: greedy, the mode in
	// which DFlash is exact and fastest). DefaultTopP applies when a request has no top_p
	// (default 1).
	DefaultTemperature float64
	DefaultTopP        float64

	// CORSOrigins lists the browser origins allowed to call the API ("*" allows any).
	// Empty: no CORS headers, so browsers on other origins cannot read responses.
	CORSOrigins []string

	ReadHeaderTimeout time.Duration // default 10s
	ReadTimeout       time.Duration // whole request including body; default 60s
	// WriteTimeout bounds each write to the client (default 60s): a client that stops
	// reading a stream is cut after this long, which frees the generation slot. The stall
	// starts once the connection's buffers are full: Serve keeps the server's side to 64 KiB,
	// so that they cannot swallow a whole answer. It is not a limit on the length of a
	// generation.
	WriteTimeout time.Duration
	IdleTimeout  time.Duration // keep-alive idle; default 120s

	MaxBodyBytes int64 // default 8 MiB; larger bodies get 413

	// StreamKeepAlive is how long a Responses or Messages stream may stay silent (while the
	// prompt is prefilled, say) before the server sends a keep-alive: a comment or a ping
	// event (default 10s).
	StreamKeepAlive time.Duration

	// ResponseStoreBytes bounds the memory of the stored responses that /v1/responses keeps
	// for GET, previous_response_id and item_reference (default 64 MiB); the least recently
	// used are dropped first.
	ResponseStoreBytes int64

	// DrainTimeout is how long shutdown waits for running and queued requests to finish
	// before it cancels them (default 30s).
	DrainTimeout time.Duration
}

// NoQueue is the MaxQueue of a server that lets no request wait: while every generation
// slot is taken, every other request gets 429. (MaxQueue 0 means the default, as every zero field does.)
const NoQueue = -1

const (
	defaultHost              = "127.0.0.1"
	defaultMaxQueue          = 32
	defaultMaxTokens         = 4096
	defaultReadHeaderTimeout = 10 * time.Second
	defaultReadTimeout       = 60 * time.Second
	defaultWriteTimeout      = 60 * time.Second
	defaultIdleTimeout       = 120 * time.Second
	defaultMaxBodyBytes      = 8 << 20
	defaultDrainTimeout      = 30 * time.Second
	defaultResponseStore     = 64 << 20
	defaultStreamKeepAlive   = 10 * time.Second
)

// queueLimit is how many requests may wait, NoQueue read as none.
func (cfg Config) queueLimit() int { return max(cfg.MaxQueue, 0) }

// withDefaults returns cfg with every unset field filled in.
func (cfg Config) withDefaults() Config {
	cfg.Host = cmp.Or(cfg.Host, defaultHost)
	cfg.MaxQueue = cmp.Or(cfg.MaxQueue, defaultMaxQueue)
	cfg.DefaultMaxTokens = cmp.Or(cfg.DefaultMaxTokens, defaultMaxTokens)
	cfg.DefaultTopP = cmp.Or(cfg.DefaultTopP, 1)
	cfg.ReadHeaderTimeout = cmp.Or(cfg.ReadHeaderTimeout, defaultReadHeaderTimeout)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, defaultReadTimeout)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, defaultWriteTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, defaultIdleTimeout)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, defaultMaxBodyBytes)
	cfg.DrainTimeout = cmp.Or(cfg.DrainTimeout, defaultDrainTimeout)
	cfg.ResponseStoreBytes = cmp.Or(cfg.ResponseStoreBytes, defaultResponseStore)
	cfg.StreamKeepAlive = cmp.Or(cfg.StreamKeepAlive, defaultStreamKeepAlive)
	return cfg
}

// validate reports the first setting that cannot work, naming it.
func (cfg Config) validate() error {
	switch {
	case cfg.Port < 0 || cfg.Port > 65535:
		return fmt.Errorf("port %d is outside 0..65535", cfg.Port)
	case cfg.MaxQueue < NoQueue:
		return fmt.Errorf("max queue %d is negative (NoQueue, %d, lets no request wait)", cfg.MaxQueue, NoQueue)
	case cfg.DefaultMaxTokens < 0:
		return fmt.Errorf("default max tokens %d is negative", cfg.DefaultMaxTokens)
	case cfg.MaxTokensLimit < 0:
		return fmt.Errorf("max tokens limit %d is negative", cfg.MaxTokensLimit)
	case cfg.DefaultTemperature < 0 || cfg.DefaultTemperature > 2:
		return fmt.Errorf("default temperature %g is outside [0, 2]", cfg.DefaultTemperature)
	case cfg.DefaultTopP < 0 || cfg.DefaultTopP > 1:
		return fmt.Errorf("default top_p %g is outside [0, 1]", cfg.DefaultTopP)
	case cfg.MaxBodyBytes < 0:
		return fmt.Errorf("max body bytes %d is negative", cfg.MaxBodyBytes)
	case cfg.ResponseStoreBytes < 0:
		return fmt.Errorf("response store bytes %d is negative", cfg.ResponseStoreBytes)
	case cfg.ReadHeaderTimeout < 0 || cfg.ReadTimeout < 0 || cfg.WriteTimeout < 0 ||
		cfg.IdleTimeout < 0 || cfg.DrainTimeout < 0 || cfg.StreamKeepAlive < 0:
		return fmt.Errorf("timeouts must not be negative")
	}
	for _, origin := range cfg.CORSOrigins {
		if origin == "*" {
			continue
		}
		u, err := url.Parse(origin)
		if err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" || strings.HasSuffix(origin, "/") {
			return fmt.Errorf("CORS origin %q is not of the form scheme://host[:port]", origin)
		}
	}
	return nil
}

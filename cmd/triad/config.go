package main

import (
	"flag"
	"fmt"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/wire"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/triadhq/triad/auth/seal"
	"github.com/triadhq/triad/metrics"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
)

// config is the binary's one flat configuration, filled from flags and their
// TRIAD_* environment twins (a flag on the command line wins) and validated
// once by validate.
type config struct {
	Addr     string
	Store    string
	Data     string
	LogLevel string

	S3Endpoint  string
	S3Bucket    string
	S3AccessKey string
	S3SecretKey string
	S3Region    string

	MaxJSONBytes   int64
	MaxStreamBytes int64

	Sandbox sandboxConfig

	TavilyURL      string
	ReplaySearches bool
	Recipes        string

	E2B e2bConfig

	// serve's own flags (see serveFlags).
	Auth        string
	TLSCert     string
	TLSKey      string
	MetricsAddr string
	MetricsAuth bool
	PublicURL   string
	ShareSecret string
	SealSecret  string
	ShareTTL    time.Duration
	ShareMaxTTL time.Duration
	Quotas      quotaConfig
	Console     bool
	SessionTTL  time.Duration
	ScrubRate   string
	BodyIdle    time.Duration
	BodyTimeout time.Duration

	scrubRate int64
	// Retain, GCEvery and GCGrace are the keeper's: the retention of
	// runs and the collection of blobs no run holds.
	Retain  time.Duration
	GCEvery time.Duration
	GCGrace time.Duration

	// metrics, when set, receives what the stack does (triad serve).
	metrics *metrics.Metrics
}

// e2bConfig holds the flags of the E2B surface (triad serve only).
type e2bConfig struct {
	Enabled        bool
	APIKey         string
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	Domain         string
}

func (c *e2bConfig) flags(f *flagSet) {
	f.boolean(&c.Enabled, "e2b", true, "serve E2B's sandbox API beside Triad's own, for E2B's SDKs (E2B_API_URL and E2B_SANDBOX_URL both point at --addr)")
	f.str(&c.APIKey, "e2b-api-key", "", "the X-API-Key E2B's control plane demands (E2B_API_KEY in the SDKs); empty leaves it open, as the rest of the API")
	f.duration(&c.DefaultTimeout, "e2b-default-timeout", 300*time.Second, "lifetime of an E2B sandbox whose create names none; past it the kernel stops and the files stay")
	f.duration(&c.MaxTimeout, "e2b-max-timeout", 0, "longest lifetime an E2B sandbox may ask for; 0 means no cap")
	f.str(&c.Domain, "e2b-domain", "", "the domain getHost(port) builds <port>-<sandboxID>.<domain> under, a wildcard name that reaches --addr; empty means the request's own host (127.0.0.1 becomes localhost)")
}

func (c *e2bConfig) validate() error {
	if c.DefaultTimeout <= 0 || c.MaxTimeout < 0 {
		return fmt.Errorf("--e2b-default-timeout must be positive and --e2b-max-timeout not negative")
	}
	return nil
}

// quotaConfig holds the per-tenant quota flags.
type quotaConfig struct {
	Kernels     int
	StoredBytes string
	RunsPerHour int
	Uploads     int

	storedBytes int64
}

// serveFlags registers the flags only triad serve has.
func (c *config) serveFlags(f *flagSet) {
	f.str(&c.Addr, "addr", "127.0.0.1:8080", "listen address; any address but loopback needs an API key to exist (or --auth none)")
	f.str(&c.Auth, "auth", "keys", "keys: callers send an API key (Authorization: Bearer), except on loopback before the first key exists; none: no authentication, every caller is the operator")
	f.str(&c.TLSCert, "tls-cert", "", "PEM certificate (chain) to serve HTTPS with; reloaded on SIGHUP")
	f.str(&c.TLSKey, "tls-key", "", "PEM private key of --tls-cert; reloaded on SIGHUP")
	f.str(&c.MetricsAddr, "metrics-addr", "", "serve /metrics on this address of its own instead of on --addr")
	f.boolean(&c.MetricsAuth, "metrics-auth", false, "make /metrics on --addr need an admin key (it needs none by default)")
	f.str(&c.PublicURL, "public-url", "", "the server's URL as callers reach it, for share links (default: the request's scheme and host)")
	f.str(&c.ShareSecret, "share-secret", "", "secret that signs share links, at least 16 bytes (default: drawn once and kept in the store, so replicas agree); changing it voids every link")
	f.str(&c.SealSecret, "seal-secret", "", "secret that seals what callers give as secrets (an E2B sandbox's envs) in the store, at least 16 bytes (default: drawn once and kept in the store, which keeps them out of plain text but not from whoever copies the whole store); changing it makes sealed values unreadable")
	f.duration(&c.ShareTTL, "share-ttl", 24*time.Hour, "a share link's lifetime when the request names none")
	f.duration(&c.ShareMaxTTL, "share-max-ttl", 30*24*time.Hour, "the longest lifetime a share link may ask for")
	f.boolean(&c.Console, "console", true, "serve the web console at / (sign in with an API key)")
	f.duration(&c.SessionTTL, "session-ttl", 12*time.Hour, "how long a console sign-in lasts")
	f.int(&c.Quotas.Kernels, "quota-kernels", 4, "most kernels one tenant's runs may have in use (busy or starting) at once; at the limit a new kernel reclaims the least recently used idle one (0: no limit)")
	f.str(&c.Quotas.StoredBytes, "quota-stored-bytes", "10GiB", "most bytes one tenant's runs may hold (0: no limit)")
	f.int(&c.Quotas.RunsPerHour, "quota-runs-per-hour", 200, "most runs one tenant may start in an hour (0: no limit)")
	f.int(&c.Quotas.Uploads, "quota-uploads", 4, "most streamed uploads one tenant may have in flight at once (0: no limit)")
	f.duration(&c.BodyIdle, "body-idle", time.Minute, "cut a request body no byte of which arrived for this long (408 body_timeout); 0: never")
	f.duration(&c.BodyTimeout, "body-timeout", time.Hour, "cut a request body still arriving after this long (408 body_timeout); 0: never")
	f.duration(&c.Retain, "retain", 0, "delete runs whose last activity is older than this, like 720h, as DELETE /runs/{id} does (0: keep every run)")
	f.duration(&c.GCEvery, "gc-every", time.Hour, "how often to finish interrupted run deletions, apply --retain and remove blobs no run holds (0: never)")
	f.duration(&c.GCGrace, "gc-grace", orchestrator.DefaultGrace, "how long a blob no run holds is kept before it is removed: longer than any write takes between storing a blob and linking it (at least 10m)")
	f.str(&c.ScrubRate, "scrub-rate", "0", "re-hash every stored blob in the background at this many bytes a second, like 20MiB, quarantining those that fail (as triad fsck); 0: off")
}

// body is how request bodies are read: under --body-idle and
// --body-timeout.
func (c *config) body() bodyread.Config {
	return bodyread.Config{Idle: c.BodyIdle, Total: c.BodyTimeout}
}

// validateServe checks serve's own flags.
func (c *config) validateServe() error {
	switch c.Auth {
	case "keys", "none":
	default:
		return fmt.Errorf("--auth %q: want keys or none", c.Auth)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("--tls-cert and --tls-key go together: give both (HTTPS) or neither (HTTP)")
	}
	if c.ShareSecret != "" && len(c.ShareSecret) < 16 {
		return fmt.Errorf("--share-secret (TRIAD_SHARE_SECRET) must be at least 16 bytes")
	}
	if c.SealSecret != "" && len(c.SealSecret) < seal.MinSecret {
		return fmt.Errorf("--seal-secret (TRIAD_SEAL_SECRET) must be at least %d bytes", seal.MinSecret)
	}
	if c.SessionTTL <= 0 {
		return fmt.Errorf("--session-ttl must be positive")
	}
	if c.ShareTTL < wire.MinShareTTL || c.ShareMaxTTL < c.ShareTTL {
		return fmt.Errorf("--share-ttl must be at least %s and at most --share-max-ttl", wire.MinShareTTL)
	}
	if c.BodyIdle < 0 || c.BodyTimeout < 0 {
		return fmt.Errorf("--body-idle and --body-timeout must be 0 (never) or positive")
	}
	if c.Quotas.Kernels < 0 || c.Quotas.RunsPerHour < 0 || c.Quotas.Uploads < 0 {
		return fmt.Errorf("--quota-kernels, --quota-runs-per-hour and --quota-uploads must be 0 (no limit) or positive")
	}
	if strings.TrimSpace(c.Quotas.StoredBytes) != "0" {
		var err error
		if c.Quotas.storedBytes, err = parseBytes(c.Quotas.StoredBytes); err != nil {
			return fmt.Errorf("--quota-stored-bytes: %w", err)
		}
	}
	if c.Retain < 0 || c.GCEvery < 0 {
		return fmt.Errorf("--retain and --gc-every must be 0 (off) or positive")
	}
	if c.GCGrace < 10*tmpfs.FreshenAge {
		return fmt.Errorf("--gc-grace %s: want at least %s (blobs found again refresh their stored time once a minute)", c.GCGrace, 10*tmpfs.FreshenAge)
	}
	if strings.TrimSpace(c.ScrubRate) != "0" {
		var err error
		if c.scrubRate, err = parseBytes(c.ScrubRate); err != nil {
			return fmt.Errorf("--scrub-rate (TRIAD_SCRUB_RATE): %w", err)
		}
	}
	if c.PublicURL != "" && !strings.HasPrefix(c.PublicURL, "http://") && !strings.HasPrefix(c.PublicURL, "https://") {
		return fmt.Errorf("--public-url %q: want a URL starting with http:// or https://", c.PublicURL)
	}
	return nil
}

// envName maps a flag name to its environment twin: --s3-endpoint is TRIAD_S3_ENDPOINT.
func envName(flagName string) string {
	return "TRIAD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagSet wraps flag.FlagSet so each flag reads its default from its twin.
type flagSet struct {
	*flag.FlagSet
	errs []error
}

func newFlagSet(name string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &flagSet{FlagSet: fs}
}

func (f *flagSet) str(p *string, name, def, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		def = v
	}
	f.StringVar(p, name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) bytes(p *int64, name string, def int64, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: want a byte count", envName(name), v))
		} else {
			def = n
		}
	}
	f.Int64Var(p, name, def, usage+" ["+envName(name)+"]")
}

// common registers the flags every subcommand that opens a store shares.
func (c *config) common(f *flagSet) {
	f.str(&c.Store, "store", "local", "file store: local or s3")
	f.str(&c.Data, "data", "./.triad", "data directory (blobs and indexes for --store local; caches and kernel working directories always)")
	f.str(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.str(&c.S3Endpoint, "s3-endpoint", "", "S3 endpoint URL for --store s3; its scheme (http or https) decides TLS")
	f.str(&c.S3Bucket, "s3-bucket", "", "S3 bucket for --store s3; created if missing")
	f.str(&c.S3AccessKey, "s3-access-key", "", "S3 access key for --store s3")
	f.str(&c.S3SecretKey, "s3-secret-key", "", "S3 secret key for --store s3")
	f.str(&c.S3Region, "s3-region", "", "S3 region (optional)")
	f.bytes(&c.MaxJSONBytes, "max-json-bytes", 32<<20, "largest JSON body and inline file content")
	f.bytes(&c.MaxStreamBytes, "max-stream-bytes", 5<<30, "largest streamed upload (PUT /tmp/files)")
	c.Sandbox.flags(f)
	f.str(&c.TavilyURL, "tavily-url", "", "Tavily API base URL, for proxies and tests (default https://api.tavily.com); the key is read from TAVILY_API_KEY")
	f.boolean(&c.ReplaySearches, "replay-searches", false, "answer every browser.search from the run's recorded citations instead of Tavily")
	f.str(&c.Recipes, "recipes", "", "directory of user recipes (*.md) added to the standard ones")
}

// parse reads args into c and validates it. Register the command's own
// flags and call common before it.
func (c *config) parse(f *flagSet, args []string) error {
	if err := f.Parse(args); err != nil {
		return err
	}
	return c.validate(f)
}

func (c *config) validate(f *flagSet) error {
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	if c.Data == "" {
		return fmt.Errorf("--data (TRIAD_DATA) must name a directory")
	}
	// Absolute, so that the sandbox's container labels (a hash of the work
	// root) do not depend on the directory triad was started from.
	abs, err := filepath.Abs(c.Data)
	if err != nil {
		return fmt.Errorf("--data %q: %w", c.Data, err)
	}
	c.Data = abs
	switch c.Store {
	case "local":
	case "s3":
		for _, req := range []struct{ v, name string }{
			{c.S3Endpoint, "s3-endpoint"}, {c.S3Bucket, "s3-bucket"}, {c.S3AccessKey, "s3-access-key"}, {c.S3SecretKey, "s3-secret-key"},
		} {
			if req.v == "" {
				return fmt.Errorf("--store s3 needs --%s (%s)", req.name, envName(req.name))
			}
		}
		if !strings.HasPrefix(c.S3Endpoint, "http://") && !strings.HasPrefix(c.S3Endpoint, "https://") {
			return fmt.Errorf("--s3-endpoint %q: want a URL starting with http:// or https://", c.S3Endpoint)
		}
	default:
		return fmt.Errorf("--store %q: want local or s3", c.Store)
	}
	if c.MaxJSONBytes <= 0 || c.MaxStreamBytes <= 0 {
		return fmt.Errorf("--max-json-bytes and --max-stream-bytes must be positive")
	}
	if _, err := c.level(); err != nil {
		return err
	}
	return c.Sandbox.validate()
}

func (c *config) level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

func (f *flagSet) float(p *float64, name string, def float64, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: want a number", envName(name), v))
		} else {
			def = n
		}
	}
	f.Float64Var(p, name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) int64(p *int64, name string, def int64, usage string) {
	f.bytes(p, name, def, usage)
}

func (f *flagSet) int(p *int, name string, def int, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: want an integer", envName(name), v))
		} else {
			def = n
		}
	}
	f.IntVar(p, name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) duration(p *time.Duration, name string, def time.Duration, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: want a duration like 60s", envName(name), v))
		} else {
			def = d
		}
	}
	f.DurationVar(p, name, def, usage+" ["+envName(name)+"]")
}

func (f *flagSet) boolean(p *bool, name string, def bool, usage string) {
	if v, ok := os.LookupEnv(envName(name)); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: want true or false", envName(name), v))
		} else {
			def = b
		}
	}
	f.BoolVar(p, name, def, usage+" ["+envName(name)+"]")
}

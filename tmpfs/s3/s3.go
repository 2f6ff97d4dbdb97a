// Package s3 keeps a tmpfs store in an S3 bucket (MinIO or any S3-compatible service) through minio-go.
//
// Layout in the bucket:
//
//	blobs/sha256/<hex>              a blob, named by the sha256 of its bytes (also in its
//	                                x-amz-meta-sha256): the bytes themselves (up to 8 MiB,
//	                                one PUT), or an empty manifest naming the upload that
//	                                holds them (larger bodies, uploaded in parts as they arrive)
//	blobs/uploads/<time>-<id>       the bytes of large blobs, named before their hash was known
//	quarantine/sha256/<hex>[.json]  blobs (or manifests) that failed verification, moved
//	                                aside by fsck or the scrub, and what was found
//	runs/<run>/index/<sha256(path)> one small JSON object per index entry: a tmpfs.File
//	meta/<key>!                     Triad's records outside runs (tmpfs.Meta), read through
//
// The bucket is the only durable state: a process started with an empty
// local directory sees every blob and every run's files. Nothing is
// spooled to local disk; a large upload holds a few parts in memory.
//
// Index entries are keyed by the sha256 of their path rather than the path
// itself: a run path may be 1024 bytes (safepath.MaxPath) but an S3 key may
// not exceed 1024 bytes in all, and MinIO refuses an object "a/b" while an
// object "a" exists, which a run's history (delete "a", write "a/b") would
// otherwise hit. The path is inside the JSON.
//
// Each entry being its own object, concurrent writes to one run touch
// different keys and never lose one another, in this process or across
// processes. Reads are served from a per-run cache, loaded from the bucket on
// a run's first use and updated by this process's writes. That cache assumes
// one triad process writes a given run at a time; replicas sharing a bucket
// take turns through the orchestrator's run lock and call Index.Forget when
// another replica may have written the run since (a second process writing
// the run without that is seen only after a restart).
//
// Every error that leaves the package is a tmpfs sentinel or plain text: a
// missing object becomes tmpfs.ErrNotFound, and a refused connection, a
// timeout, a DNS failure, a 5xx, refused credentials or a bucket deleted
// under a running store become tmpfs.ErrUnavailable with the cause kept in
// the message. minio-go's retries
// are bounded and dials are short, so an unreachable store fails within
// seconds rather than minutes.
package s3

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/triadhq/triad/tmpfs"
)

// Config says where the bucket is and how to reach it.
type Config struct {
	// Endpoint is the service's URL, such as http://127.0.0.1:9000 or
	// https://s3.amazonaws.com. Its scheme decides TLS.
	Endpoint string
	// Bucket holds everything. New creates it if it is missing.
	Bucket string
	// AccessKey and SecretKey are the credentials.
	AccessKey, SecretKey string
	// Region is the bucket's region. Empty lets the client ask the service
	// (once per bucket); MinIO's default is us-east-1.
	Region string
	// Timeout bounds each metadata request (a stat, an index entry read
	// or write, a listing) and the wait for a blob's bytes to start
	// arriving, retries included, so a store that hangs rather than
	// refusing connections still fails in bounded time. Zero means 15s.
	Timeout time.Duration
	// Logger receives debug records for uploads and index loads and error
	// records for corrupt index entries. Nil is silent.
	Logger *slog.Logger
}

// Timeouts and retry bounds. They make a store that does not answer fail in
// seconds: a dead endpoint refuses connections at once, so the cost is the
// retries' backoff (at most about 0.6 s in all); an address that swallows
// packets costs one dial timeout per attempt.
const (
	maxRetries     = 3 // minio-go attempts per request, the first included
	dialTimeout    = 3 * time.Second
	headerTimeout  = 30 * time.Second // after a request is sent, for the response to start
	defaultTimeout = 15 * time.Second // Config.Timeout's default
	pingTimeout    = 3 * time.Second  // at most; less if Config.Timeout is shorter
	maxSinglePut   = 5 << 30          // S3's largest single PUT; larger blobs go multipart
	loadWorkers    = 16               // parallel GETs when a run's index is loaded
	contentTypeBin = "application/octet-stream"
)

// conn is what Blobs and Index share: one client, one bucket.
type conn struct {
	core    minio.Core
	tr      *http.Transport
	bucket  string
	timeout time.Duration
	log     *slog.Logger
}

// New connects to the bucket described by cfg, creating the bucket if it is
// missing, and returns the blob store and the index over it. They share one
// client. If the service does not answer, the error satisfies
// errors.Is(err, tmpfs.ErrUnavailable) and the caller may retry.
func New(ctx context.Context, cfg Config) (*Blobs, *Index, error) {
	c, err := dial(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := c.ensureBucket(ctx, cfg.Region); err != nil {
		c.tr.CloseIdleConnections()
		return nil, nil, err
	}
	return &Blobs{c: c}, newIndex(c), nil
}

// dial builds the client; it does no I/O.
func dial(cfg Config) (*conn, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("S3 endpoint %q must be an http:// or https:// URL with a host, such as http://127.0.0.1:9000", cfg.Endpoint)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return nil, fmt.Errorf("S3 endpoint %q must not have a path or query; name the bucket with the bucket setting", cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, errors.New("no S3 bucket configured")
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("S3 access key and secret key are both required")
	}
	secure := u.Scheme == "https"
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: headerTimeout,
		ExpectContinueTimeout: time.Second,
		// Objects are served as stored; a transparent gunzip would change
		// the bytes the digest is checked against.
		DisableCompression: true,
	}
	if secure {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client, err := minio.New(u.Host, &minio.Options{
		Creds:      credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:     secure,
		Transport:  tr,
		Region:     cfg.Region,
		MaxRetries: maxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("S3 client for %s: %v", cfg.Endpoint, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	return &conn{core: minio.Core{Client: client}, tr: tr, bucket: cfg.Bucket, timeout: timeout, log: log}, nil
}

func (c *conn) ensureBucket(ctx context.Context, region string) error {
	tctx, cancel := c.withTimeout(ctx)
	defer cancel()
	ok, err := c.core.BucketExists(tctx, c.bucket)
	if err != nil {
		return c.fail(ctx, "check bucket "+c.bucket, err)
	}
	if ok {
		return nil
	}
	err = c.core.MakeBucket(tctx, c.bucket, minio.MakeBucketOptions{Region: region})
	if err == nil {
		c.log.InfoContext(ctx, "created S3 bucket", "bucket", c.bucket)
		return nil
	}
	// Another process may have created it between the check and the make.
	if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" {
		return nil
	}
	return c.fail(ctx, "create bucket "+c.bucket, err)
}

// closeIdle drops pooled connections. The client stays usable.
func (c *conn) closeIdle() { c.tr.CloseIdleConnections() }

// withTimeout bounds a metadata operation.
func (c *conn) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// fail translates an error from minio-go or the network into the tmpfs
// sentinels, naming op. No minio-go type is wrapped, so none escapes; net
// and url errors are, for their detail. ctx is the caller's, not a timeout
// derived from it: if the caller's context ended, that is the error, because
// the caller gave up and the store may be fine, while our own timeouts
// expiring mean the store did not answer.
func (c *conn) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%s: %w", op, context.Cause(ctx))
	}
	var er minio.ErrorResponse
	if errors.As(err, &er) {
		msg := er.Code
		if er.Message != "" {
			msg += ": " + er.Message
		}
		switch {
		case er.Code == "NoSuchBucket":
			// The bucket existed at startup (New creates it), so this is a
			// broken store, not a missing file.
			return fmt.Errorf("%w: %s: bucket %s does not exist: %s", tmpfs.ErrUnavailable, op, c.bucket, msg)
		case er.Code == "NoSuchKey" || er.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %s: %s", tmpfs.ErrNotFound, op, msg)
		case er.StatusCode >= 500 || er.Code == "SlowDown" || er.Code == "RequestTimeout":
			return fmt.Errorf("%w: %s: S3 answered %d %s", tmpfs.ErrUnavailable, op, er.StatusCode, msg)
		case er.Code == "AccessDenied" || er.Code == "InvalidAccessKeyId" || er.Code == "SignatureDoesNotMatch" ||
			er.Code == "ExpiredToken" || er.Code == "InvalidToken":
			// Not the caller's doing, and nothing it can fix: to a caller the
			// store is as good as down until an operator fixes the credentials.
			return fmt.Errorf("%w: %s: S3 refused the credentials (check the access and secret keys): %s", tmpfs.ErrUnavailable, op, msg)
		}
		return fmt.Errorf("%s: S3 answered %d %s", op, er.StatusCode, msg)
	}
	if unreachable(err) {
		return fmt.Errorf("%w: %s: %w", tmpfs.ErrUnavailable, op, err)
	}
	return fmt.Errorf("%s: %v", op, err)
}

// unreachable reports whether err means the service could not be reached or
// stopped answering: refused or reset connections, timeouts (our own
// deadlines included), DNS failures and connections cut mid-response.
func unreachable(err error) bool {
	var ne net.Error
	var dns *net.DNSError
	var op *net.OpError
	switch {
	case errors.As(err, &dns), errors.As(err, &op), errors.As(err, &ne):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return true
	}
	var ue *url.Error
	return errors.As(err, &ue) // any other transport failure
}

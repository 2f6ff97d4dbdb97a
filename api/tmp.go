package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
)

// jsonTool adapts a run-scoped tool whose input is a JSON body: it reads the
// run, decodes the body strictly, calls the tool and writes its answer.
func jsonTool[In, Out any](s *Server, call func(ctx context.Context, run runid.ID, in In) (Out, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := run(r)
		if err != nil {
			return err
		}
		var in In
		if err := s.decode(w, r, &in); err != nil {
			return err
		}
		out, err := call(r.Context(), id, in)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, out)
	}
}

// queryTool adapts a run-scoped tool whose one input is a query parameter.
func queryTool[Out any](s *Server, name string, required bool, call func(ctx context.Context, run runid.ID, v string) (Out, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := run(r)
		if err != nil {
			return err
		}
		v, err := query(r, name, required)
		if err != nil {
			return err
		}
		out, err := call(r.Context(), id, v)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, out)
	}
}

// filePut streams a raw body into the run: hashed on the fly, never whole in
// memory.
func (s *Server) filePut(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	p, err := pathVar(r)
	if err != nil {
		return err
	}
	if limit := s.orch.Limits().StreamBody; r.ContentLength > limit {
		return fault.New(fault.TooLarge, fmt.Sprintf("the body is %d bytes; the streamed limit is %d", r.ContentLength, limit),
			"split the file, or raise --max-stream-bytes (TRIAD_MAX_STREAM_BYTES)")
	}
	if err := noEncoding(r); err != nil {
		return err
	}
	// The body is read whole, under the body deadlines, before the run's
	// lock is taken (WriteStream stores it, then links it): a client that
	// stalls holds no run.
	body := bodyread.New(w, r, s.c.Body)
	defer body.Close()
	out, err := s.orch.WriteStream(r.Context(), id, p, body)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// fileGet serves a run file's raw bytes with Content-Type, a strong ETag (its
// sha256) and Range support.
func (s *Server) fileGet(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	p, err := pathVar(r)
	if err != nil {
		return err
	}
	f, rd, err := s.orch.Open(r.Context(), id, p)
	if err != nil {
		return err
	}
	defer rd.Close()
	w.Header().Set("X-Content-SHA256", f.SHA256.String())
	return s.serveBlob(w, r, blobRead{run: id, path: f.Path, d: f.SHA256, modUnix: f.ModifiedAt.Unix()}, rd)
}

// blobGet serves a blob by sha256 to a caller who names (X-Run-Id, or
// ?run= in a link) a run
// it may read that holds those bytes. Without one, or with any other run,
// the answer is one not_found, whether the blob exists or not: no caller
// learns that some bytes are stored by asking (docs/DECISIONS.md, "Who
// may fetch a blob"). Blobs are immutable, so a served one is cacheable,
// but only privately: the answer depends on who asked.
func (s *Server) blobGet(w http.ResponseWriter, r *http.Request) error {
	raw := mux.Vars(r)["sha256"]
	d, err := tmpfs.ParseDigest(raw)
	if err != nil {
		return fault.Wrap(fault.BadInput, err, fmt.Sprintf("%q is not a sha256", raw),
			"use the 64 hex digits that tmp.write, tmp.list or files_out reported")
	}
	rid := r.Header.Get(RunHeader)
	if rid == "" {
		if rid, err = query(r, "run", false); err != nil {
			return err
		}
	}
	name, err := query(r, "name", false)
	if err != nil {
		return err
	}
	id, err := runid.Parse(rid)
	if err != nil {
		return orchestrator.BlobNotFound(d)
	}
	rd, err := s.orch.OpenBlob(r.Context(), id, d)
	if err != nil {
		return err
	}
	defer rd.Close()
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	w.Header().Set("Vary", "Authorization, Cookie, X-Run-Id")
	if name != "" {
		w.Header().Set("Content-Disposition", attachment(name))
	}
	return s.serveBlob(w, r, blobRead{run: id, d: d}, rd)
}

// blobRead names what serveBlob serves: a run's file (path set) or a blob
// by hash.
type blobRead struct {
	run     runid.ID
	path    string
	d       tmpfs.Digest
	modUnix int64
}

// fail turns a read's error into the fault the caller sees.
func (b blobRead) fail(err error) error {
	what := fmt.Sprintf("blob %s", b.d)
	if b.path != "" {
		what = fmt.Sprintf("%q", b.path)
	}
	switch {
	case errors.Is(err, tmpfs.ErrDigestMismatch):
		return fault.Wrap(fault.Corrupt, err, "the stored bytes of "+what+" do not match their sha256, so they were not served",
			"write the file again (tmp.write or PUT /tmp/files/{path}): the same bytes restore it")
	case errors.Is(err, tmpfs.ErrQuarantined):
		return fault.Wrap(fault.Corrupt, err, "the stored bytes of "+what+" failed their sha256 check and were quarantined; they are never served",
			"write the file again (tmp.write or PUT /tmp/files/{path}): the same bytes restore it")
	}
	return orchestrator.StoreError(err, b.run, b.path)
}

// serveBlob writes a verified blob, with a strong ETag (its sha256), Range
// and HEAD (http.ServeContent).
//
// A blob stored as a local file is served from the file itself, which the
// kernel sends (sendfile), once it is known good: its fingerprint shows it
// unchanged since it was verified, or it is hashed whole first. A corrupt
// one is refused with a structured error before a byte is sent.
//
// Other blobs (S3) stream through a reader that hashes as it goes: full
// reads abort the connection on a mismatch, never sending the last chunk;
// ranged reads and HEAD verify the whole blob first, because a range alone
// cannot be checked against the digest (Store.Verify remembers a verified
// version, so that costs one pass).
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request, b blobRead, rd *tmpfs.Reader) error {
	w.Header().Set("ETag", strconv.Quote(b.d.String()))
	w.Header().Set("Accept-Ranges", "bytes")
	ct := ""
	if b.path != "" {
		ct = mime.TypeByExtension(path.Ext(b.path))
	}
	if ct == "" {
		ct = "application/octet-stream"
	}
	// Always set: with no Content-Type, ServeContent would sniff the first
	// bytes and seek back, which ends the hashing read-ahead.
	w.Header().Set("Content-Type", ct)
	if err := suffixZero(r); err != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", rd.Size()))
		return err
	}
	// http.ServeContent answers an unsatisfiable Range with a text/plain
	// 416: the caller gets the error body instead.
	w = &rangeErrors{ResponseWriter: w, s: s, r: r}
	f, err := rd.File(r.Context())
	if err != nil {
		return b.fail(err)
	}
	if f != nil {
		http.ServeContent(w, r, "", modTime(b.modUnix), f)
		return nil
	}
	// A range cannot be checked against the digest, and a HEAD reads
	// nothing: both check the whole blob first (once per stored version).
	if r.Method == http.MethodHead || r.Header.Get("Range") != "" {
		if err := s.orch.Store().Verify(r.Context(), b.d); err != nil {
			return b.fail(err)
		}
	}
	cr := &checkedReader{r: rd}
	http.ServeContent(chunkWriter{w, cr}, r, "", modTime(b.modUnix), cr)
	if cr.err != nil && errors.Is(cr.err, tmpfs.ErrDigestMismatch) {
		// Headers and part of the body are out: the only honest answer is
		// to cut the connection so the client sees a broken transfer.
		s.log.ErrorContext(r.Context(), "aborted a download whose bytes do not match their sha256", "sha256", b.d.String())
		panic(http.ErrAbortHandler)
	}
	return nil
}

// suffixZero refuses a Range that asks for the last 0 bytes ("bytes=-0"):
// RFC 9110 says that range is unsatisfiable, and http.ServeContent would
// answer it with a 206 whose Content-Range runs backwards.
func suffixZero(r *http.Request) error {
	h := r.Header.Get("Range")
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok {
		return nil
	}
	for _, part := range strings.Split(spec, ",") {
		if p := strings.TrimSpace(part); strings.HasPrefix(p, "-") && strings.Trim(p[1:], "0") == "" && len(p) > 1 {
			return unsatisfiable(h)
		}
	}
	return nil
}

func unsatisfiable(h string) error {
	return fault.New(fault.RangeNotSatisfiable, fmt.Sprintf("the range %q selects no bytes of the file", h),
		"ask for a range within the file's size (HEAD gives Content-Length), such as bytes=0-1023 or bytes=-1024")
}

// rangeErrors turns the plain-text 416 http.ServeContent writes into the
// error body; every other answer passes through.
type rangeErrors struct {
	http.ResponseWriter
	s       *Server
	r       *http.Request
	swallow bool
}

func (w *rangeErrors) WriteHeader(status int) {
	if status != http.StatusRequestedRangeNotSatisfiable {
		w.ResponseWriter.WriteHeader(status)
		return
	}
	w.swallow = true
	w.s.writeError(w.ResponseWriter, w.r, unsatisfiable(w.r.Header.Get("Range")), 0)
}

func (w *rangeErrors) Write(b []byte) (int, error) {
	if w.swallow {
		return len(b), nil // the plain-text message, replaced
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps chunkWriter's fast path and sendfile reachable.
func (w *rangeErrors) ReadFrom(src io.Reader) (int64, error) {
	if w.swallow {
		return io.Copy(io.Discard, src)
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, src)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *rangeErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// checkedReader remembers the first read error, which http.ServeContent swallows.
type checkedReader struct {
	r   *tmpfs.Reader
	err error
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

func (c *checkedReader) Seek(off int64, whence int) (int64, error) { return c.r.Seek(off, whence) }

// chunkWriter hands a whole-body copy from a checkedReader to the
// reader's WriteTo, so each hashed chunk goes to the connection in one
// write instead of through io.Copy's 32 KiB buffer. http.ServeContent
// copies the body with io.CopyN, which reaches ReadFrom here; any other
// copy (a range, a HEAD has none) takes the ordinary path.
type chunkWriter struct {
	http.ResponseWriter
	cr *checkedReader
}

func (w chunkWriter) ReadFrom(src io.Reader) (int64, error) {
	if lr, ok := src.(*io.LimitedReader); ok && lr.R == io.Reader(w.cr) {
		if pos, err := w.cr.r.Seek(0, io.SeekCurrent); err == nil && lr.N == w.cr.r.Size()-pos {
			n, err := w.cr.r.WriteTo(w.ResponseWriter)
			lr.N -= n
			if err != nil && w.cr.err == nil {
				w.cr.err = err
			}
			return n, err
		}
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, src)
}

// Unwrap lets http.ResponseController reach the connection.
func (w chunkWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// pathVar returns the {path} route variable, unescaped but not cleaned: the
// orchestrator's validator decides.
func pathVar(r *http.Request) (string, error) {
	raw := mux.Vars(r)["path"]
	p, err := url.PathUnescape(raw)
	if err != nil {
		return "", fault.Wrap(fault.BadInput, err, "the path in the URL is not validly escaped", "percent-encode the path (RFC 3986)")
	}
	return p, nil
}

func query(r *http.Request, name string, required bool) (string, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", fault.Wrap(fault.BadInput, err, "the query string is malformed", "percent-encode query parameters")
	}
	v, ok := q[name]
	if !ok || len(v) == 0 {
		if required {
			return "", fault.New(fault.BadInput, fmt.Sprintf("query parameter %q is missing", name), fmt.Sprintf("add ?%s=... to the URL", name))
		}
		return "", nil
	}
	return v[0], nil
}

func modTime(unix int64) time.Time {
	if unix <= 0 {
		return time.Time{}
	}
	return time.Unix(unix, 0)
}

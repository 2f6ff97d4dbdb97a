package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/triadhq/triad/api/e2b/envd/filesystem/filesystemconnect"
	"github.com/triadhq/triad/api/e2b/envd/process/processconnect"
	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/internal/bodyread"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
)

type sandboxKey struct{}

// sandboxOf returns the sandbox the data-plane middleware resolved.
func sandboxOf(ctx context.Context) Sandbox {
	sb, _ := ctx.Value(sandboxKey{}).(Sandbox)
	return sb
}

func (s *Server) dataRoutes() http.Handler {
	mux := http.NewServeMux()
	// envd REST.
	mux.Handle("/health", s.methods(map[string]handlerFunc{http.MethodGet: s.health}))
	mux.Handle("/envs", s.methods(map[string]handlerFunc{http.MethodGet: s.envs}))
	mux.Handle("/files", s.methods(map[string]handlerFunc{http.MethodGet: s.fileGet, http.MethodHead: s.fileGet, http.MethodPost: s.filePost}))
	// envd Connect services. Their own errors are Connect errors; see
	// connectErr.
	opts := []connect.HandlerOption{connect.WithInterceptors(recoverInterceptor(s)),
		connect.WithReadMaxBytes(int(min(s.c.Core.Limits().JSONBody, 1<<30)))}
	p, h := filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...)
	mux.Handle(p, h)
	p, h = processconnect.NewProcessHandler(&processService{s: s}, opts...)
	mux.Handle(p, h)
	// The code interpreter.
	mux.Handle("/execute", s.methods(map[string]handlerFunc{http.MethodPost: s.execute}))
	mux.Handle("/contexts", s.methods(map[string]handlerFunc{http.MethodGet: s.contextsList, http.MethodPost: s.contextCreate}))
	mux.Handle("/contexts/{id}", s.methods(map[string]handlerFunc{http.MethodDelete: s.contextRemove}))
	mux.Handle("/contexts/{id}/restart", s.methods(map[string]handlerFunc{http.MethodPost: s.contextRestart}))
	mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return fault.New(fault.NotFound, fmt.Sprintf("no route %s %s in the sandbox", r.Method, r.URL.Path),
			"the data plane serves envd (/files, /health, filesystem.Filesystem, process.Process) and the code interpreter (/execute, /contexts)")
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sb, err := s.admit(r)
		var ae envdAuthError
		if errors.As(err, &ae) {
			s.log.InfoContext(r.Context(), "E2B signed files URL refused", "method", r.Method, "err", err)
			writeJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": ae.msg})
			return
		}
		if err != nil {
			// isRunning (/health) reads a 502 as "not running" and
			// nothing else (docs/e2b-protocol.md §5).
			if connectPath(r.URL.Path) {
				s.writeConnectError(w, r, err)
			} else {
				s.writeError(w, r, err, 0)
			}
			return
		}
		// The data plane acts as whoever created the sandbox's run, as
		// the core records it.
		p, err := s.c.Core.Creator(r.Context(), sb.ID)
		if err != nil {
			s.writeError(w, r, statusError{http.StatusBadGateway, fault.New(fault.NotFound, fmt.Sprintf("sandbox %s has no run", sb.ID),
				"create a sandbox again; Sandbox.list shows the sandboxes")}, 0)
			return
		}
		ctx := auth.With(context.WithValue(r.Context(), sandboxKey{}, sb), p)
		if port, ok := otherPort(r.Header.Get(HeaderSandboxPort)); ok {
			// A port of the sandbox's own processes, as getHost's.
			s.proxyPort(w, r.WithContext(ctx), sb, port, "E2b-Sandbox-Port")
			return
		}
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
}

// admit resolves the sandbox a data-plane request names and checks it may
// be served: it exists, the request carries one of its access tokens, and
// it is running. The token is the data plane's only credential: the
// envd calls send it as X-Access-Token, the code interpreter's context
// calls (which never send that) as E2B-Traffic-Access-Token, which create
// and connect hand out as trafficAccessToken. A sandbox that is not here
// and a request without one of its tokens get one answer, 502 (what the
// SDKs read as "the sandbox is not running", docs/e2b-protocol.md §3), the
// same byte for byte, so the data plane tells nobody which sandboxes
// exist; only a caller with a token learns that its sandbox is paused.
//
// A files request signed with one of the sandbox's tokens (downloadUrl,
// uploadUrl) is admitted by its signature instead, with or without
// E2b-Sandbox-Id (see signing.go).
func (s *Server) admit(r *http.Request) (Sandbox, error) {
	raw := r.Header.Get(HeaderSandboxID)
	if raw == "" && isSigned(r) {
		return s.admitSigned(r)
	}
	notRunning := func(msg, sug string) error {
		return statusError{http.StatusBadGateway, fault.New(fault.NotFound, msg, sug)}
	}
	if port := r.Header.Get(HeaderSandboxPort); port != "" {
		if _, ok := otherPort(port); !ok && port != EnvdPort && port != InterpreterPort {
			return Sandbox{}, notRunning(fmt.Sprintf("port %q of sandbox %q is not a TCP port", port, raw),
				"send E2b-Sandbox-Port from 1 to 65535: envd (49983), the code interpreter (49999), or a port a process in the sandbox listens on")
		}
	}
	unknown := notRunning(fmt.Sprintf("no running sandbox %q takes this access token", raw),
		"use the sandbox object that Sandbox.create or Sandbox.connect returned (connect hands out a fresh token); a killed sandbox is gone, but its run's journal and files stay readable through Triad's API")
	id, err := runid.Parse(raw)
	if err != nil {
		return Sandbox{}, unknown
	}
	sb, err := s.reg.get(r.Context(), id)
	if errors.Is(err, ErrNoRecord) {
		return sb, unknown
	}
	if err != nil {
		return sb, fault.Wrap(fault.StoreUnavailable, err, "the sandbox record could not be read", "retry; GET /healthz shows the store's state")
	}
	if !sb.tokenOK(r.Header.Get(HeaderAccessToken)) && !sb.tokenOK(r.Header.Get(HeaderTrafficToken)) {
		if r.Header.Get(HeaderAccessToken) != "" || !isSigned(r) {
			return Sandbox{}, unknown
		}
		l, err := parseSigned(r)
		if err != nil {
			return Sandbox{}, err
		}
		if !l.signedBy(sb) {
			return Sandbox{}, unknown
		}
		if l.expired(time.Now()) {
			return Sandbox{}, errExpiredLink
		}
	}
	if sb.State != StateRunning {
		return sb, notRunning(fmt.Sprintf("sandbox %s is paused: it passed its timeout", id),
			"Sandbox.connect resumes it with a fresh kernel over the same files")
	}
	return sb, nil
}

// health answers isRunning: admit let it through, so the sandbox runs
// (and the caller holds one of its tokens).
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// envs is envd's GET /envs. E2B's code-interpreter server reads the
// sandbox's envs there to set them in its kernel; Triad sets them itself
// (orchestrator.WithEnv, and a command's env), so nothing needs them, and
// they are secrets, which no API returns: the answer is always empty.
func (s *Server) envs(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, map[string]string{})
}

// fileGet is files.read: GET /files?path=, the bytes streamed from the
// store as tmp.read.
func (s *Server) fileGet(w http.ResponseWriter, r *http.Request) error {
	sb := sandboxOf(r.Context())
	if op, ok := outside(r.URL.Query().Get("path")); ok {
		return s.fileGetOutside(w, r, op)
	}
	p, err := filePathParam(r)
	if err != nil {
		return err
	}
	f, rd, err := s.c.Core.Open(r.Context(), sb.ID, p)
	if err != nil {
		return err
	}
	defer rd.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
	w.Header().Set("X-Content-SHA256", f.SHA256.String())
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := io.Copy(w, rd); err != nil {
		// Headers and part of the body are out: cut the connection so
		// the client sees a broken transfer, never short bytes.
		s.log.ErrorContext(r.Context(), "files.read stopped mid-stream", "sandbox", sb.ID, "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func filePathParam(r *http.Request) (string, error) {
	q := r.URL.Query()
	if !q.Has("path") {
		return "", fault.New(fault.BadInput, "query parameter path is missing", "send ?path=<file>")
	}
	p, err := runPath(q.Get("path"))
	if err != nil {
		return "", err
	}
	if p == "" {
		return "", fault.New(fault.BadInput, fmt.Sprintf("%s is a directory", Home), "name a file under it")
	}
	return p, nil
}

// writeInfo is envd's answer for one uploaded file.
type writeInfo struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// filePost is files.write: POST /files, either one octet-stream body
// (?path=) or multipart parts named "file" whose filename is the path. Each
// file streams into the store as its own tmp.write.
func (s *Server) filePost(w http.ResponseWriter, r *http.Request) error {
	sb := sandboxOf(r.Context())
	meta, err := parseMetadata(r.Header)
	if err != nil {
		return err
	}
	limit := s.c.Core.Limits().StreamBody
	if r.ContentLength > limit {
		return fault.New(fault.TooLarge, fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, limit),
			"split the file, or raise --max-stream-bytes (TRIAD_MAX_STREAM_BYTES)")
	}
	// Read under the body deadlines: a client that stalls is cut, and it
	// never holds the sandbox's run (WriteStream stores before it locks).
	rb := bodyread.New(w, r, s.c.Body)
	defer rb.Close()
	var body io.Reader = rb
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(rb)
		if err != nil {
			return fault.Wrap(fault.BadInput, err, "the body is not gzip", "send gzip bytes with Content-Encoding: gzip, or drop the header")
		}
		defer zr.Close()
		body = zr
	default:
		return fault.Badf("send identity or gzip", "Content-Encoding %q is not supported", enc)
	}
	q := r.URL.Query()
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		mt = "application/octet-stream"
	}
	var out []writeInfo
	if mt != "multipart/form-data" {
		if !q.Has("path") {
			return fault.New(fault.BadInput, "query parameter path is missing", "an octet-stream upload names its file in ?path=")
		}
		if op, ok := outside(q.Get("path")); ok {
			wi, err := s.writeOutside(r.Context(), op, body, meta)
			if err != nil {
				return err
			}
			return writeJSON(w, http.StatusOK, []writeInfo{wi})
		}
		p, err := uploadPath(q.Get("path"))
		if err != nil {
			return err
		}
		ref, err := s.c.Core.WriteStream(r.Context(), sb.ID, p, body)
		if err != nil {
			return err
		}
		if err := s.setMeta(r.Context(), sb.ID, ref, meta); err != nil {
			return err
		}
		out = append(out, info(ref.Path, meta))
		return writeJSON(w, http.StatusOK, out)
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fault.Wrap(fault.BadInput, err, "the multipart body is malformed: "+err.Error(), "send multipart/form-data with one part named file per file")
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		// The part's filename is the path (docs/e2b-protocol.md §6);
		// ?path= names it for a single-file upload. Read the raw
		// filename: FileName() would keep only its base name.
		name := rawFileName(part)
		if q.Has("path") {
			name = q.Get("path")
		}
		if op, ok := outside(name); ok {
			wi, err := s.writeOutside(r.Context(), op, part, meta)
			part.Close()
			if err != nil {
				return err
			}
			out = append(out, wi)
			continue
		}
		p, err := uploadPath(name)
		if err != nil {
			part.Close()
			return err
		}
		ref, err := s.c.Core.WriteStream(r.Context(), sb.ID, p, part)
		part.Close()
		if err != nil {
			return err
		}
		if err := s.setMeta(r.Context(), sb.ID, ref, meta); err != nil {
			return err
		}
		out = append(out, info(ref.Path, meta))
	}
	if len(out) == 0 {
		return fault.New(fault.BadInput, "the multipart body has no part named file", "send one part named file per file, its filename the path")
	}
	return writeJSON(w, http.StatusOK, out)
}

func uploadPath(p string) (string, error) {
	rp, err := runPath(p)
	if err != nil {
		return "", err
	}
	if rp == "" {
		return "", fault.New(fault.BadInput, fmt.Sprintf("%s is a directory", Home), "name a file under it")
	}
	return rp, nil
}

func rawFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

func info(p string, meta map[string]string) writeInfo {
	return writeInfo{Path: sdkPath(p), Name: path.Base(p), Type: "file", Metadata: meta}
}

// otherPort reads an E2b-Sandbox-Port that names a port of the sandbox's
// own processes: any TCP port but envd's and the interpreter's.
func otherPort(raw string) (int, bool) {
	if raw == EnvdPort || raw == InterpreterPort {
		return 0, false
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}

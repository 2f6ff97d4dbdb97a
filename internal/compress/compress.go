// Package compress gzips HTTP answers of text types (JSON, HTML, CSS, JavaScript, Markdown) for clients that accept it, and leaves everything else as it is.
//
// An answer is compressed when all of these hold: the request accepts
// gzip and asks for no range; the answer is one of the text types below
// (a run's CSV or JSON file downloaded whole included), is not a byte
// range, is not already encoded, is not an event stream, and is not
// under MinSize. Such an answer carries Vary:
// Accept-Encoding, loses its Content-Length, and its ETag becomes weak
// (the bytes on the wire are not the entity's). See docs/DECISIONS.md,
// "Compressed answers".
package compress

import (
	"bufio"
	"compress/gzip"
	"errors"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// MinSize is the smallest answer worth compressing: below it, gzip's
// header and trailer cost more than they save.
const MinSize = 1024

// Level is the gzip level: fast, and within a few per cent of the best on
// JSON and JavaScript.
const Level = 5

var writers = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, Level)
	return w
}}

// Handler compresses next's answers as the package describes.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead || r.Header.Get("Range") != "" || !acceptsGzip(r.Header.Values("Accept-Encoding")) {
			next.ServeHTTP(w, r)
			return
		}
		cw := &writer{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				// A handler that cuts the connection (http.ErrAbortHandler)
				// must not get a well-formed end: the client is to see a
				// broken transfer, not a complete-looking one.
				cw.abandon()
				panic(v)
			}
			cw.close()
		}()
		next.ServeHTTP(cw, r)
	})
}

// acceptsGzip reports whether Accept-Encoding allows gzip (q > 0).
func acceptsGzip(values []string) bool {
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name != "gzip" && name != "*" {
				continue
			}
			q := 1.0
			if k, val, ok := strings.Cut(strings.TrimSpace(params), "="); ok && strings.TrimSpace(k) == "q" {
				q, _ = strconv.ParseFloat(strings.TrimSpace(val), 64)
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}

// compressible lists the media types worth compressing.
func compressible(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	switch mt {
	case "application/json", "text/html", "text/css", "text/javascript", "application/javascript", "text/markdown", "text/plain",
		"text/csv", "text/tab-separated-values", "image/svg+xml":
		return true
	}
	return strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// writer holds an answer's first MinSize bytes, or its status alone when
// it cannot be compressed, until it knows whether to compress it.
type writer struct {
	http.ResponseWriter
	status  int  // the status the handler set, not yet sent
	decided bool // the status is sent, compressed (gz) or not
	gz      *gzip.Writer
	buf     []byte
}

// eligible reports whether the answer, as its headers stand, may be
// compressed.
func (w *writer) eligible() bool {
	h := w.Header()
	s := w.status
	if s < 200 || s == http.StatusNoContent || s == http.StatusPartialContent || s == http.StatusNotModified ||
		h.Get("Content-Encoding") != "" || h.Get("Content-Range") != "" || !compressible(h.Get("Content-Type")) {
		return false
	}
	n, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64)
	return err != nil || n >= MinSize
}

// start sends the status, compressed or not, and what was held.
func (w *writer) start(compress bool) error {
	w.decided = true
	h := w.Header()
	if compress {
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Encoding", "gzip")
		h.Del("Content-Length")
		if et := h.Get("ETag"); et != "" && !strings.HasPrefix(et, "W/") {
			h.Set("ETag", "W/"+et)
		}
		w.gz = writers.Get().(*gzip.Writer)
		w.gz.Reset(w.ResponseWriter)
	} else if compressible(h.Get("Content-Type")) {
		h.Add("Vary", "Accept-Encoding")
	}
	w.ResponseWriter.WriteHeader(w.status)
	buf := w.buf
	w.buf = nil
	if len(buf) == 0 {
		return nil
	}
	_, err := w.write(buf)
	return err
}

func (w *writer) write(b []byte) (int, error) {
	if w.gz != nil {
		return w.gz.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *writer) WriteHeader(status int) {
	if w.decided || w.status != 0 {
		return
	}
	w.status = status
	if status < 200 {
		w.status = 0 // an informational answer goes out now; the real one follows
		w.ResponseWriter.WriteHeader(status)
		return
	}
	if !w.eligible() {
		w.start(false)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	if w.decided {
		return w.write(b)
	}
	if w.status == 0 {
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", http.DetectContentType(b))
		}
		w.WriteHeader(http.StatusOK)
		if w.decided {
			return w.write(b)
		}
	}
	w.buf = append(w.buf, b...)
	if len(w.buf) >= MinSize {
		if err := w.start(true); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// Flush sends what is held or compressed so far.
func (w *writer) Flush() {
	if !w.decided {
		if w.status == 0 {
			w.status = http.StatusOK
		}
		w.start(w.eligible() && len(w.buf) >= MinSize)
	}
	if w.gz != nil {
		w.gz.Flush()
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands the connection over, for a handler that takes it (an
// upgraded stream), before anything was sent.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok && !w.decided && w.status == 0 {
		w.decided = true
		return h.Hijack()
	}
	return nil, nil, errors.New("compress: the connection cannot be hijacked")
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// abandon drops the compressor without writing gzip's trailer.
func (w *writer) abandon() {
	if w.gz != nil {
		w.gz.Reset(nil)
		writers.Put(w.gz)
		w.gz = nil
	}
}

// close ends the answer: a short one goes out as it is, with its length.
func (w *writer) close() {
	if !w.decided && w.status != 0 {
		if w.Header().Get("Content-Length") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(len(w.buf)))
		}
		w.start(false)
	}
	if w.gz != nil {
		w.gz.Close()
		w.gz.Reset(nil)
		writers.Put(w.gz)
		w.gz = nil
	}
}

package compress_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/compress"
)

func TestHandler(t *testing.T) {
	big := strings.Repeat(`{"step": 1, "tool": "sandbox.exec"},`, 200)
	cases := []struct {
		name    string
		accept  string
		rng     string
		method  string
		serve   func(w http.ResponseWriter)
		gzipped bool
	}{
		{name: "JSON", accept: "gzip, deflate, br", serve: answer("application/json", big), gzipped: true},
		{name: "JavaScript", accept: "gzip", serve: answer("text/javascript; charset=utf-8", big), gzipped: true},
		{name: "HTML", accept: "br;q=1.0, gzip;q=0.8", serve: answer("text/html; charset=utf-8", big), gzipped: true},
		{name: "a problem+json error", accept: "gzip", serve: answer("application/problem+json", big), gzipped: true},
		{name: "in pieces, no length", accept: "gzip", serve: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			for i := 0; i < len(big); i += 100 {
				io.WriteString(w, big[i:min(len(big), i+100)])
			}
		}, gzipped: true},
		{name: "no gzip accepted", accept: "", serve: answer("application/json", big)},
		{name: "gzip refused", accept: "gzip;q=0, identity", serve: answer("application/json", big)},
		{name: "small", accept: "gzip", serve: answer("application/json", `{"ok":true}`)},
		{name: "a range asked for", accept: "gzip", rng: "bytes=0-99", serve: answer("application/json", big)},
		{name: "HEAD", accept: "gzip", method: "HEAD", serve: answer("application/json", big)},
		{name: "a CSV downloaded whole", accept: "gzip", serve: func(w http.ResponseWriter) {
			w.Header().Set("Accept-Ranges", "bytes")
			answer("text/csv", big)(w)
		}, gzipped: true},
		{name: "a range answered", accept: "gzip", serve: func(w http.ResponseWriter) {
			w.Header().Set("Content-Range", "bytes 0-99/5000")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusPartialContent)
			io.WriteString(w, big[:100])
		}},
		{name: "already compressed", accept: "gzip", serve: func(w http.ResponseWriter) {
			w.Header().Set("Content-Encoding", "br")
			answer("application/json", big)(w)
		}},
		{name: "a PNG", accept: "gzip", serve: answer("image/png", big)},
		{name: "an event stream", accept: "gzip", serve: answer("text/event-stream", big)},
		{name: "not modified", accept: "gzip", serve: func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotModified)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(compress.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.serve(w) })))
			defer srv.Close()
			method := tc.method
			if method == "" {
				method = "GET"
			}
			req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL, nil)
			if tc.accept != "" {
				req.Header.Set("Accept-Encoding", tc.accept)
			}
			if tc.rng != "" {
				req.Header.Set("Range", tc.rng)
			}
			// The transport must not decompress for us.
			resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			got := resp.Header.Get("Content-Encoding") == "gzip"
			if got != tc.gzipped {
				t.Fatalf("Content-Encoding %q: got gzipped %v, want %v", resp.Header.Get("Content-Encoding"), got, tc.gzipped)
			}
			if !got {
				return
			}
			zr, err := gzip.NewReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			plain, err := io.ReadAll(zr)
			if err != nil || string(plain) != big {
				t.Fatalf("the gzipped body does not decode to the answer: %v (%d bytes)", err, len(plain))
			}
			if len(raw) >= len(big)/4 {
				t.Errorf("compressed %d bytes to %d", len(big), len(raw))
			}
			if v := resp.Header.Get("Vary"); !strings.Contains(v, "Accept-Encoding") {
				t.Errorf("Vary: got %q, want Accept-Encoding", v)
			}
			if resp.Header.Get("Content-Length") != "" && resp.Header.Get("Content-Length") != strconv.Itoa(len(raw)) {
				t.Errorf("Content-Length %s for %d bytes", resp.Header.Get("Content-Length"), len(raw))
			}
		})
	}
}

func answer(ct, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Header().Set("ETag", `"abc"`)
		io.WriteString(w, body)
	}
}

// A compressed answer's ETag is weak: its bytes are not the entity's, and
// a weak comparison (If-None-Match) still matches it.
func TestWeakETag(t *testing.T) {
	srv := httptest.NewServer(compress.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer("application/json", strings.Repeat("x", 4096))(w)
	})))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if et := resp.Header.Get("ETag"); et != `W/"abc"` {
		t.Errorf("ETag: got %q, want W/\"abc\"", et)
	}
}

// A handler that cuts its answer short (http.ErrAbortHandler) leaves the
// client a broken transfer, not a gzip stream that ends well.
func TestAbortStaysBroken(t *testing.T) {
	srv := httptest.NewServer(compress.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/markdown")
		io.WriteString(w, strings.Repeat("# journal\n", 500))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err == nil {
		_, err = io.ReadAll(zr)
	}
	if err == nil {
		t.Fatal("an aborted answer decoded as a whole gzip stream")
	}
}

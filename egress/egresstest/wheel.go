package egresstest

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Wheel is a pure-Python wheel made by a test.
type Wheel struct {
	// Name is the distribution's name; Module the module it installs.
	Name, Version, Module string
	// File is the wheel's file name, Data its bytes.
	File string
	Data []byte
}

// MakeWheel builds a wheel that installs one module, name.py, whose
// source is src.
func MakeWheel(t testing.TB, name, version, src string) Wheel {
	t.Helper()
	dist := regexp.MustCompile(`[-_.]+`).ReplaceAllString(name, "_")
	info := dist + "-" + version + ".dist-info/"
	files := []struct{ name, body string }{
		{dist + ".py", src},
		{info + "METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a wheel made by a Triad test\n", name, version)},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: triad-egresstest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(info + "RECORD,,\n")
	w, err := zw.Create(info + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return Wheel{Name: name, Version: version, Module: dist, File: dist + "-" + version + "-py3-none-any.whl", Data: buf.Bytes()}
}

// WriteTo writes the wheel into dir (a wheelhouse) and returns its path.
func (w Wheel) WriteTo(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, w.File)
	if err := os.WriteFile(p, w.Data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// PackageIndex serves wheels as a package index in PEP 503's simple
// form: /simple/NAME/ lists a distribution's files, /files/FILE serves one.
func PackageIndex(wheels ...Wheel) http.Handler {
	norm := func(s string) string { return strings.ToLower(regexp.MustCompile(`[-_.]+`).ReplaceAllString(s, "-")) }
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/{name}/", func(w http.ResponseWriter, r *http.Request) {
		var links strings.Builder
		for _, wh := range wheels {
			if norm(wh.Name) == norm(r.PathValue("name")) {
				sum := sha256.Sum256(wh.Data)
				fmt.Fprintf(&links, "<a href=\"/files/%s#sha256=%s\">%s</a><br>\n", html.EscapeString(wh.File), hex.EncodeToString(sum[:]), html.EscapeString(wh.File))
			}
		}
		if links.Len() == 0 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, "<!DOCTYPE html><html><body>\n%s</body></html>\n", links.String())
	})
	mux.HandleFunc("/files/{file}", func(w http.ResponseWriter, r *http.Request) {
		for _, wh := range wheels {
			if wh.File == r.PathValue("file") {
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Write(wh.Data)
				return
			}
		}
		http.NotFound(w, r)
	})
	return mux
}

// Package console is Triad's web console: HTML pages, served by triad serve at / from the binary itself, that call the JSON API as the signed-in key's principal.
//
// The console is a surface of its own beside api: it never imports it.
// Its pages are html/template shells with embedded CSS and plain
// JavaScript (no build step); the browser calls the API (runs, events,
// files, exec, notes, shares) with the session cookie and a CSRF token,
// and the console itself serves only what the API has no answer for: the
// pages, sign-in and sign-out, and Markdown (CEL.md, a run's .md files)
// rendered to HTML on the server. See docs/DECISIONS.md, "The web
// console".
package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
	"github.com/triadhq/triad/auth/session"
	"github.com/triadhq/triad/internal/fault"
	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

//go:embed templates static
var files embed.FS

// Prefix starts every path the console serves, but its home page at /.
const Prefix = "/console/"

// signinCookie carries the sign-in form's CSRF token (double submit):
// before a session exists there is no server-side token to compare.
const signinCookie = "triad_signin"

// maxMarkdown is the largest Markdown file the console renders.
const maxMarkdown = 4 << 20

// Core is what the console's pages ask the orchestrator on the server
// side (everything else the browser asks the API): whether the viewer may
// see a run, and its journal and Markdown files to render.
// *orchestrator.Orchestrator implements it.
type Core interface {
	Visible(ctx context.Context, run runid.ID) error
	ReadRun(ctx context.Context, run runid.ID) (*orchestrator.RunReader, error)
}

var _ Core = (*orchestrator.Orchestrator)(nil)

// Config configures a Console.
type Config struct {
	Orchestrator Core
	// Keys authenticates sign-ins. Nil means authentication is off
	// (--auth none): there is no sign-in, and the console is the
	// operator's.
	Keys *keys.Store
	// OpenWithoutKeys serves the console without sign-in while no key
	// exists (loopback before the first key), as the API does.
	OpenWithoutKeys bool
	// Sessions keeps sign-ins; required when Keys is set.
	Sessions *session.Store
	// TLS marks the session cookie Secure and adds HSTS.
	TLS    bool
	Logger *slog.Logger
}

// Console serves the web console.
type Console struct {
	c      Config
	o      Core
	log    *slog.Logger
	pages  map[string]*template.Template
	static http.Handler
	// assets is a hash of the static files, appended to their URLs so a
	// browser never runs an old script against a new server.
	assets string
	// etags are the static files' ETags (a hash of each), so a module
	// that pages import without the assets hash (lib.js, the editor) is
	// revalidated, not downloaded again.
	etags map[string]string
	mux   *http.ServeMux
}

// New returns a Console.
func New(c Config) (*Console, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Keys != nil && c.Sessions == nil {
		return nil, errors.New("console: Keys needs Sessions")
	}
	con := &Console{c: c, o: c.Orchestrator, log: c.Logger, pages: map[string]*template.Template{}}
	funcs := template.FuncMap{"asset": func(name string) string { return Prefix + "static/" + name + "?v=" + con.assets }}
	for _, p := range []string{"signin", "runs", "run", "launch", "scratch", "keys", "kernels", "notfound"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", p, err)
		}
		con.pages[p] = t
	}
	sub, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	con.etags = map[string]string{}
	fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(sub, p)
			h.Write([]byte(p))
			h.Write(b)
			sum := sha256.Sum256(b)
			con.etags[p] = `"` + hex.EncodeToString(sum[:16]) + `"`
		}
		return nil
	})
	con.assets = hex.EncodeToString(h.Sum(nil))[:12]
	con.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(sub))

	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", con.page(con.runsPage))
	m.HandleFunc("GET "+Prefix+"signin", con.signinForm)
	m.HandleFunc("POST "+Prefix+"signin", con.signin)
	m.HandleFunc("POST "+Prefix+"signout", con.signout)
	m.HandleFunc("GET "+Prefix+"launch", con.page(con.launchPage))
	m.HandleFunc("GET "+Prefix+"keys", con.page(con.keysPage))
	m.HandleFunc("GET "+Prefix+"kernels", con.page(con.kernelsPage))
	m.HandleFunc("GET "+Prefix+"runs/{id}", con.page(con.runPage))
	m.HandleFunc("GET "+Prefix+"runs/{id}/scratch", con.page(con.scratchPage))
	m.HandleFunc("GET "+Prefix+"runs/{id}/cel", con.fragment(con.celFragment))
	m.HandleFunc("GET "+Prefix+"runs/{id}/render/{path...}", con.fragment(con.renderFragment))
	m.HandleFunc("GET "+Prefix+"runs/{id}/notebook/{path...}", con.fragment(con.notebookFragment))
	m.HandleFunc("GET "+Prefix+"static/", con.serveStatic)
	m.HandleFunc(Prefix, con.notFound)
	con.mux = m
	return con, nil
}

// Handler serves the console's paths (GET / and everything under
// /console/) and hands every other request to next, the API.
func (c *Console) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if (p == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead)) || strings.HasPrefix(p, Prefix) {
			c.secure(w.Header())
			c.mux.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// csp is the console pages' Content-Security-Policy: scripts and styles
// only from the console's own files (no inline script, no eval), images
// from the server and data: URLs (cell output), frames only of the
// server's own (sandboxed) files, and nothing may frame the console.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; " +
	"frame-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// pageCSP is csp for a page: its styles may also be in <style> elements
// that carry the page's nonce, a fresh one per page, which only the
// console's own editor uses (CodeMirror's layout styles; see
// docs/DECISIONS.md, "The scratch notebook's editor").
func pageCSP(nonce string) string {
	return strings.Replace(csp, "style-src 'self'", "style-src 'self' 'nonce-"+nonce+"'", 1)
}

func (c *Console) secure(h http.Header) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if c.c.TLS {
		h.Set("Strict-Transport-Security", "max-age=31536000; includeSubDomains")
	}
}

// viewer is who is looking: the principal, and the session when signed
// in (nil when no sign-in is needed).
type viewer struct {
	p    auth.Principal
	sess *session.Session
}

// errSignIn means the request needs a session it does not have.
var errSignIn = errors.New("console: sign in")

// needsSignIn reports whether callers must sign in: keys are on and, for
// a server open on loopback, a key exists.
func (c *Console) needsSignIn(ctx context.Context) (bool, error) {
	if c.c.Keys == nil {
		return false, nil
	}
	if c.c.OpenWithoutKeys {
		return c.c.Keys.Any(ctx)
	}
	return true, nil
}

// viewer resolves the request's session, or the operator where no
// sign-in is needed.
func (c *Console) viewer(r *http.Request) (viewer, error) {
	need, err := c.needsSignIn(r.Context())
	if err != nil {
		return viewer{}, err
	}
	if !need {
		return viewer{p: auth.Operator}, nil
	}
	ck, err := r.Cookie(session.CookieName)
	if err != nil || ck.Value == "" {
		return viewer{}, errSignIn
	}
	s, p, err := c.c.Sessions.Resolve(r.Context(), ck.Value)
	if err != nil {
		if fe := fault.As(err); fe != nil && fe.Kind == fault.Auth {
			return viewer{}, errSignIn
		}
		return viewer{}, err
	}
	return viewer{p: p, sess: &s}, nil
}

// pageData is what every page's template sees.
type pageData struct {
	Title   string
	Page    string
	Version string
	// SignedIn shows the sign-out button; Who names the principal.
	SignedIn bool
	Who      string
	Tenant   string
	CSRF     string
	CanWrite bool
	Admin    bool
	// Keys says the server keeps API keys (authentication is on).
	Keys   bool
	RunID  string
	Recipe string
	Error  string
	Next   string
	Status int
	// Nonce is the page's CSP nonce for styles (render fills it in).
	Nonce string
}

// page wraps a page handler: it resolves the viewer (sending a browser
// that must sign in to the sign-in page), and renders what the handler
// fills in.
func (c *Console) page(h func(r *http.Request, v viewer, d *pageData) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := c.viewer(r)
		if errors.Is(err, errSignIn) {
			http.Redirect(w, r, Prefix+"signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d := c.data(v)
		r = r.WithContext(auth.With(r.Context(), v.p))
		if err := h(r, v, &d); err != nil {
			if fe := fault.As(err); fe != nil && fe.Kind == fault.NotFound {
				c.notFound(w, r)
				return
			}
			c.fail(w, r, err)
			return
		}
		c.render(w, d.Page, d)
	}
}

func (c *Console) data(v viewer) pageData {
	d := pageData{Version: version.String(), CanWrite: v.p.Has(auth.Runs), Admin: v.p.Admin(), Keys: c.c.Keys != nil, Tenant: v.p.Tenant, Who: v.p.Name}
	if v.sess != nil {
		d.SignedIn, d.CSRF = true, v.sess.CSRF
	}
	return d
}

// render writes a page; pages hold a CSRF token, so no cache keeps them.
func (c *Console) render(w http.ResponseWriter, page string, d pageData) {
	t := c.pages[page]
	if d.Page == "" {
		d.Page = page
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	d.Nonce = newToken()
	w.Header().Set("Content-Security-Policy", pageCSP(d.Nonce))
	status := d.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if err := t.Execute(w, d); err != nil {
		c.log.Error("console: render page", "page", page, "err", err)
	}
}

// fail answers an unexpected error with a page that says what to do.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	fe := fault.From(err)
	status := fault.Status(fe.Kind)
	lvl := slog.LevelInfo
	if status >= 500 {
		lvl = slog.LevelError
	}
	c.log.Log(r.Context(), lvl, "console request failed", "path", r.URL.Path, "status", status, "kind", fe.Kind, "err", err)
	c.render(w, "notfound", pageData{Title: "Something went wrong", Page: "notfound", Status: status, Version: version.String(),
		Error: fe.Message + ". " + fe.Suggestion})
}

func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	d := pageData{Title: "Not found", Page: "notfound", Status: http.StatusNotFound, Version: version.String()}
	if v, err := c.viewer(r); err == nil {
		d = c.data(v)
		d.Title, d.Page, d.Status = "Not found", "notfound", http.StatusNotFound
	}
	c.render(w, "notfound", d)
}

func (c *Console) runsPage(r *http.Request, v viewer, d *pageData) error {
	d.Title, d.Page = "Runs", "runs"
	return nil
}

func (c *Console) launchPage(r *http.Request, v viewer, d *pageData) error {
	d.Title, d.Page = "Launch a recipe", "launch"
	d.Recipe = r.URL.Query().Get("recipe")
	return nil
}

// kernelsPage lists the tenant's live kernels and frees them (GET
// /kernels and its actions, from the page).
func (c *Console) kernelsPage(r *http.Request, v viewer, d *pageData) error {
	d.Title, d.Page = "Kernels", "kernels"
	return nil
}

// keysPage manages API keys; a key that is not an admin's sees why it
// cannot (403), and authentication off (--auth none) has no keys to show.
func (c *Console) keysPage(r *http.Request, v viewer, d *pageData) error {
	if c.c.Keys == nil {
		return fault.New(fault.NotFound, "authentication is off, so there are no keys", "start triad serve without --auth none to use API keys")
	}
	d.Title, d.Page = "API keys", "keys"
	if !v.p.Admin() {
		d.Status = http.StatusForbidden
	}
	return nil
}

// runOf parses the {id} of the path and checks that the viewer may see
// the run: a run of another tenant is not found, like one nobody made.
func (c *Console) runOf(r *http.Request) (runid.ID, error) {
	id, err := runid.Parse(r.PathValue("id"))
	if err != nil {
		return id, fault.New(fault.NotFound, "no such run", "GET / lists your runs")
	}
	return id, c.o.Visible(r.Context(), id)
}

func (c *Console) runPage(r *http.Request, v viewer, d *pageData) error {
	id, err := c.runOf(r)
	if err != nil {
		return err
	}
	d.Title, d.Page, d.RunID = "Run "+id.String(), "run", id.String()
	return nil
}

func (c *Console) scratchPage(r *http.Request, v viewer, d *pageData) error {
	id, err := c.runOf(r)
	// "New scratch run" opens the page for an id it minted: the run is
	// made by its first cell or upload (as any tool call naming a fresh
	// id makes it), so a scratch run left untouched leaves nothing. The
	// page shows nothing of a run before that, so it tells nothing about
	// an id either.
	if err != nil && !(r.URL.Query().Get("new") == "1" && fault.From(err).Kind == fault.NotFound && v.p.Has(auth.Runs)) {
		return err
	}
	d.Title, d.Page, d.RunID = "Scratch "+id.String(), "scratch", id.String()
	return nil
}

// fragment wraps a handler of an HTML fragment the pages fetch: the
// viewer must be signed in (401, not a redirect, for a script), and a
// run that is not theirs is 404.
func (c *Console) fragment(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := c.viewer(r)
		if errors.Is(err, errSignIn) {
			err = fault.New(fault.Auth, "your session has ended", "sign in again")
		} else if err == nil {
			err = h(w, r.WithContext(auth.With(r.Context(), v.p)))
		}
		if err != nil {
			// The API's error body, so a page reads both alike (errorOf
			// in lib.js).
			fe := fault.From(err)
			status := fault.Status(fe.Kind)
			if status >= 500 {
				c.log.ErrorContext(r.Context(), "console fragment", "path", r.URL.Path, "err", err)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(wire.Error(err))
		}
	}
}

// celFragment renders the run's CEL.md, or with ?from=<byte offset>
// only what was appended after that offset, so a live page's update
// costs the new sections, not the journal (see docs/DECISIONS.md, "Live
// journal updates from an offset"). X-Journal-From and X-Journal-Size
// say which bytes the fragment renders: the page appends it when From is
// the offset it asked for, replaces its journal when From is 0, and asks
// from Size next time.
func (c *Console) celFragment(w http.ResponseWriter, r *http.Request) error {
	id, err := c.runOf(r)
	if err != nil {
		return err
	}
	from := int64(0)
	if q := r.URL.Query().Get("from"); q != "" {
		from, err = strconv.ParseInt(q, 10, 64)
		if err != nil || from < 0 {
			return badFrom(fmt.Sprintf("from=%q is not a byte offset", q))
		}
	}
	size, b, err := c.journalFrom(r.Context(), id, from)
	if fe := fault.As(err); fe != nil && fe.Kind == fault.NotFound {
		// The run is the viewer's (runOf) but has made no call yet: no
		// journal is news for the page, not an error.
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err != nil {
		return err
	}
	if from > size {
		// Past the end: not this journal's offset (the page is older than
		// a run deleted and made again, or made up). The whole journal.
		from = 0
		if size, b, err = c.journalFrom(r.Context(), id, 0); err != nil {
			return err
		}
	}
	if from > 0 && from < size && !sectionStart(b) {
		return badFrom(fmt.Sprintf("from=%d is not where a section of the journal starts", from))
	}
	w.Header().Set("X-Journal-From", strconv.FormatInt(from, 10))
	w.Header().Set("X-Journal-Size", strconv.FormatInt(size, 10))
	if len(b) == 0 {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return c.writeFragment(w, renderMarkdown(journalBlocks(b), id, ""))
}

// badFrom is the error of a ?from= the journal cannot start at.
func badFrom(msg string) error {
	return fault.New(fault.BadInput, msg, "ask again without from for the whole journal, then from the X-Journal-Size it answered")
}

// sectionStart reports whether tail starts a section of CEL.md: every
// write to the journal appends whole sections, each starting with a
// blank line and a heading only Triad writes (cel.Format and its
// siblings), so an offset there splits the Markdown between blocks and
// the tail renders as it does within the whole.
func sectionStart(tail []byte) bool {
	return bytes.HasPrefix(tail, []byte("\n## ")) || bytes.HasPrefix(tail, []byte("\n### "))
}

// journalFrom reads the run's CEL.md from byte from: its size, and its
// bytes after from (none when from is at or past the end). The bytes
// before from are read and discarded, not sought past: the store's
// reader checks the blob's sha256 only over a read from its start, and a
// rendered journal must never show bytes that do not match it. Hashing
// runs at about a gigabyte a second; what grew with the journal before
// was rendering it and sending it.
func (c *Console) journalFrom(ctx context.Context, id runid.ID, from int64) (int64, []byte, error) {
	rr, err := c.o.ReadRun(ctx, id)
	if err != nil {
		return 0, nil, err
	}
	f, rd, err := rr.OpenJournal(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer rd.Close()
	if from > f.Size {
		return f.Size, nil, nil
	}
	if _, err := io.CopyN(io.Discard, rd, from); err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		return 0, nil, err
	}
	return from + int64(len(b)), b, nil
}

// renderFragment renders one of the run's Markdown files, its relative
// links and images pointed at the run's files.
func (c *Console) renderFragment(w http.ResponseWriter, r *http.Request) error {
	id, err := c.runOf(r)
	if err != nil {
		return err
	}
	p := r.PathValue("path")
	if ext := strings.ToLower(path.Ext(p)); ext != ".md" && ext != ".markdown" {
		return fault.New(fault.BadInput, "only Markdown files (.md) are rendered", "download the file instead")
	}
	rr, err := c.o.ReadRun(r.Context(), id)
	if err != nil {
		return err
	}
	f, rd, err := rr.Open(r.Context(), p)
	if err != nil {
		return err
	}
	defer rd.Close()
	if f.Size > maxMarkdown {
		return fault.New(fault.TooLarge, fmt.Sprintf("%s is %d bytes, over the %d the console renders", p, f.Size, maxMarkdown), "download it instead")
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	return c.writeFragment(w, renderMarkdown(b, id, path.Dir(f.Path)))
}

func (c *Console) writeFragment(w http.ResponseWriter, html []byte) error {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, err := w.Write(html)
	return err
}

func (c *Console) serveStatic(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("v") == c.assets {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	if et, ok := c.etags[strings.TrimPrefix(r.URL.Path, Prefix+"static/")]; ok {
		w.Header().Set("ETag", et)
	}
	c.static.ServeHTTP(w, r)
}

var tokenEnc = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return tokenEnc.EncodeToString(b)
}

// safeNext keeps a post-sign-in redirect on this server.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
}

// signinForm shows the sign-in form, with a fresh double-submit token.
func (c *Console) signinForm(w http.ResponseWriter, r *http.Request) {
	need, err := c.needsSignIn(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	next := safeNext(r.URL.Query().Get("next"))
	if !need {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	c.signinPage(w, next, "", http.StatusOK)
}

func (c *Console) signinPage(w http.ResponseWriter, next, msg string, status int) {
	tok := newToken()
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: tok, Path: Prefix + "signin", MaxAge: 3600,
		HttpOnly: true, Secure: c.c.TLS, SameSite: http.SameSiteStrictMode})
	c.render(w, "signin", pageData{Title: "Sign in", Page: "signin", Version: version.String(), CSRF: tok, Next: next, Error: msg, Status: status})
}

// signin checks the key and starts a session: the cookie holds the
// session's id, never the key.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	need, err := c.needsSignIn(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		c.signinPage(w, "/", "The form could not be read; try again.", http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if !need {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	ck, err := r.Cookie(signinCookie)
	if err != nil || ck.Value == "" || !equalTokens(ck.Value, r.PostForm.Get("csrf")) {
		c.signinPage(w, next, "The sign-in form expired; enter your key again.", http.StatusForbidden)
		return
	}
	p, err := c.c.Keys.Authenticate(r.Context(), strings.TrimSpace(r.PostForm.Get("key")))
	if err != nil {
		fe := fault.From(err)
		if fe.Kind != fault.Auth {
			c.fail(w, r, err)
			return
		}
		c.log.InfoContext(r.Context(), "console sign-in refused", "err", err)
		c.signinPage(w, next, "That key was not accepted: "+fe.Message+".", http.StatusUnauthorized)
		return
	}
	s, err := c.c.Sessions.Create(r.Context(), p)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: Prefix + "signin", MaxAge: -1, HttpOnly: true, Secure: c.c.TLS, SameSite: http.SameSiteStrictMode})
	http.SetCookie(w, c.sessionCookie(s.ID, int(c.c.Sessions.TTL().Seconds())))
	c.log.InfoContext(r.Context(), "console sign-in", "key_id", p.KeyID, "tenant", p.Tenant)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) sessionCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: session.CookieName, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: c.c.TLS, SameSite: http.SameSiteStrictMode}
}

// signout ends the session; the form carries the session's CSRF token.
func (c *Console) signout(w http.ResponseWriter, r *http.Request) {
	v, err := c.viewer(r)
	if errors.Is(err, errSignIn) {
		http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if v.sess == nil {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil || !v.sess.CheckCSRF(r.PostForm.Get("csrf")) {
		c.fail(w, r, fault.New(fault.Forbidden, "the sign-out form carried no valid CSRF token", "reload the page and sign out again"))
		return
	}
	if err := c.c.Sessions.Delete(r.Context(), v.sess.ID); err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, c.sessionCookie("", -1))
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

func equalTokens(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

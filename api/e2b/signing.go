package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/triadhq/triad/internal/fault"
)

// Signed files URLs: Sandbox.downloadUrl and uploadUrl. The SDK signs a
// /files URL with the sandbox's envd access token, as envd checks it:
//
//	v1_ + base64(sha256(path:operation:user:token[:expiration])), '=' trimmed
//
// where path and user are the query's path and username ("" when absent),
// operation is read (GET) or write (POST), and expiration, when the link
// has one (useSignatureExpiration), is its Unix second in
// signature_expiration. The signature is checked first, the expiry second
// (a link whose second is before now is expired), so only a holder of the
// token learns that a link expired. The link names no sandbox: with
// E2B_SANDBOX_URL set the SDK builds <E2B_SANDBOX_URL>/files?…, so Triad
// finds the sandbox whose token made the signature. See docs/DECISIONS.md,
// "E2B surface: signed files URLs".

// Operations a signature covers.
const (
	signRead  = "read"
	signWrite = "write"
)

// signedLink is a /files request's signature, as its query carries it.
type signedLink struct {
	path, op, user, sig string
	exp                 *int64
}

// isSigned reports whether r is a files request that carries a signature.
func isSigned(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) && r.URL.Query().Has("signature")
}

// parseSigned reads r's signature; a malformed expiry is a 400.
func parseSigned(r *http.Request) (signedLink, error) {
	q := r.URL.Query()
	l := signedLink{path: q.Get("path"), op: signRead, user: q.Get("username"), sig: q.Get("signature")}
	if r.Method == http.MethodPost {
		l.op = signWrite
	}
	if q.Has("signature_expiration") {
		exp, err := strconv.ParseInt(q.Get("signature_expiration"), 10, 64)
		if err != nil {
			return l, fault.Badf("send the Unix second the SDK put there (downloadUrl/uploadUrl with useSignatureExpiration)",
				"signature_expiration %q is not an integer", q.Get("signature_expiration"))
		}
		l.exp = &exp
	}
	return l, nil
}

// fileSignature is the signature token would make for the link.
func fileSignature(path, op, user, token string, exp *int64) string {
	raw := strings.Join([]string{path, op, user, token}, ":")
	if exp != nil {
		raw += ":" + strconv.FormatInt(*exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedBy reports whether one of the sandbox's tokens made the link's
// signature. Every token is tried, so the time taken does not say which.
func (l signedLink) signedBy(sb Sandbox) bool {
	ok := 0
	for _, tok := range sb.Tokens {
		ok |= subtle.ConstantTimeCompare([]byte(fileSignature(l.path, l.op, l.user, tok, l.exp)), []byte(l.sig))
	}
	return ok == 1
}

// expired reports whether the link's expiry has passed at now.
func (l signedLink) expired(now time.Time) bool { return l.exp != nil && *l.exp < now.Unix() }

// envdAuthError is a signed link refused as envd refuses it: 401 with
// envd's own body, {code, message}, which the SDK's tests compare whole
// (see docs/DECISIONS.md, "E2B surface: signed files URLs").
type envdAuthError struct{ msg string }

func (e envdAuthError) Error() string { return e.msg }

var (
	errBadSignature = envdAuthError{"invalid signature"}
	errExpiredLink  = envdAuthError{"signature is already expired"}
)

// admitSigned resolves a signed files request that names no sandbox: the
// sandbox is the one whose token made the signature, looked for among this
// replica's sandboxes first, then among every replica's records.
func (s *Server) admitSigned(r *http.Request) (Sandbox, error) {
	l, err := parseSigned(r)
	if err != nil {
		return Sandbox{}, err
	}
	if l.sig == "" {
		return Sandbox{}, errBadSignature
	}
	sb, ok := s.reg.signer(r.Context(), l)
	if !ok {
		return Sandbox{}, errBadSignature
	}
	if l.expired(time.Now()) {
		return Sandbox{}, errExpiredLink
	}
	if sb.State != StateRunning {
		return sb, statusError{http.StatusBadGateway, fault.New(fault.NotFound, fmt.Sprintf("sandbox %s is paused: it passed its timeout", sb.ID),
			"Sandbox.connect resumes it with a fresh kernel over the same files")}
	}
	return sb, nil
}

// rescanEvery bounds how often a signature that matches no sandbox known
// here sends the registry to read every record (sandboxes another replica
// made): anyone can send forged signatures, and each full read unseals
// every record.
const rescanEvery = time.Second

// signer finds the sandbox whose token made the link's signature.
func (g *registry) signer(ctx context.Context, l signedLink) (Sandbox, bool) {
	g.mu.Lock()
	for _, sb := range g.m {
		if l.signedBy(sb) {
			g.mu.Unlock()
			return sb.clone(), true
		}
	}
	now := time.Now()
	if now.Sub(g.rescanned) < rescanEvery {
		g.mu.Unlock()
		return Sandbox{}, false
	}
	g.rescanned = now
	g.mu.Unlock()
	all, err := g.list(ctx)
	if err != nil {
		g.log.WarnContext(ctx, "look for a signed link's sandbox in the records", "err", err)
		return Sandbox{}, false
	}
	for _, sb := range all {
		if l.signedBy(sb) {
			return sb, true
		}
	}
	return Sandbox{}, false
}

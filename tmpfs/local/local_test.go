package local_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/tmpfs/local"
	"github.com/triadhq/triad/tmpfs/tmpfstest"
)

func open(t testing.TB, dir string) *tmpfs.Store {
	t.Helper()
	b, err := local.NewBlobs(dir)
	if err != nil {
		t.Fatal(err)
	}
	x, err := local.NewIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	return tmpfs.New(b, x, nil)
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	tmpfstest.Run(t, func(t *testing.T) *tmpfs.Store { return open(t, dir) })
}

// A blob altered on disk is never served: the streaming read fails at the
// end and Verify refuses it.
func TestCorruptBlobIsNotServed(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	f, err := s.WriteBytes(ctx, run, "x.txt", []byte("original bytes"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "blobs", "sha256", f.SHA256.String()[:2], f.SHA256.String())
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, []byte("tampered bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReadAll(ctx, run, "x.txt"); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
	if err := s.Verify(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("Verify: got %v, want ErrDigestMismatch", err)
	}
}

// A crash in the middle of an index append leaves a torn last line, which
// the next process ignores.
func TestTornIndexRecord(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()
	run := runid.New()
	if _, err := open(t, dir).WriteBytes(ctx, run, "ok.txt", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	logf := filepath.Join(dir, "runs", run.String(), "index.jsonl")
	f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"op":"put","path":"torn`)
	f.Close()
	s := open(t, dir)
	if _, err := s.Stat(ctx, run, "ok.txt"); err != nil {
		t.Fatalf("got %v, want ok.txt intact", err)
	}
	if _, err := s.WriteBytes(ctx, run, "next.txt", []byte("n")); err != nil {
		t.Fatal(err)
	}
	l, err := open(t, dir).List(ctx, run, "")
	if err != nil || len(l) != 2 {
		t.Fatalf("got %v, %v, want ok.txt and next.txt", l, err)
	}
	_ = bytes.MinRead
}

// A tampered blob larger than one read-ahead chunk never yields its full
// length: the last chunk is held back until the hash is checked.
func TestCorruptBlobNeverDeliversWholeBody(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	data := bytes.Repeat([]byte("0123456789abcdef"), 300<<10) // 4.7 MiB
	f, err := s.WriteBytes(ctx, run, "big.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "blobs", "sha256", f.SHA256.String()[:2], f.SHA256.String())
	os.Chmod(p, 0o600)
	bad := append([]byte(nil), data...)
	bad[len(bad)-1] ^= 1
	os.WriteFile(p, bad, 0o600)
	_, r, err := s.Open(ctx, run, "big.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
	if len(got) >= len(data) {
		t.Fatalf("the reader delivered %d of %d bytes of a corrupt blob; the last chunk must be withheld", len(got), len(data))
	}
	// Writing the true bytes again repairs the blob, which then reads
	// whole, through size-probing seeks as http.ServeContent does them.
	g, err := s.WriteBytes(ctx, run, "ok.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.OpenBlob(ctx, g.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if n, _ := r2.Seek(0, io.SeekEnd); n != int64(len(data)) {
		t.Fatalf("size probe: %d", n)
	}
	r2.Seek(0, io.SeekStart)
	got, err = io.ReadAll(r2)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("intact read: %d bytes, %v", len(got), err)
	}
}

func blobPath(dir string, d tmpfs.Digest) string {
	return filepath.Join(dir, "blobs", "sha256", d.String()[:2], d.String())
}

// flip changes one byte of blob d's file in place: same inode, same size.
func flip(t *testing.T, dir string, d tmpfs.Digest) {
	t.Helper()
	tmpfstest.FlipFileByte(t, blobPath(dir, d), -1)
}

func TestFsck(t *testing.T) {
	dir := t.TempDir()
	tmpfstest.RunFsck(t, func(t *testing.T) *tmpfs.Store { return open(t, dir) },
		func(t *testing.T, d tmpfs.Digest) { flip(t, dir, d) })
}

// A blob is verified when written and not hashed again while its file's
// fingerprint stays the one recorded, across a restart. Modified in place,
// it is hashed again, and every read fails; written back byte for byte, it
// hashes true and is trusted again.
func TestVerifiedOnce(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	data := bytes.Repeat([]byte("verified once "), 100<<10) // 1.4 MiB
	f, err := s.WriteBytes(ctx, run, "v.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	trusted := func(s *tmpfs.Store) bool {
		t.Helper()
		r, err := s.OpenBlob(ctx, f.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		return r.Verified()
	}
	if !trusted(s) {
		t.Fatal("right after the write: got a blob to hash, want it trusted by its fingerprint")
	}
	if !trusted(open(t, dir)) {
		t.Fatal("after a restart: got a blob to hash, want its fingerprint kept")
	}

	flip(t, dir, f.SHA256)
	if trusted(s) {
		t.Fatal("after an in-place change: got the blob trusted, want it hashed")
	}
	if _, _, err := s.ReadAll(ctx, run, "v.bin"); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("streaming read: got %v, want ErrDigestMismatch", err)
	}
	if err := s.Verify(ctx, f.SHA256); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("Verify (ranged reads): got %v, want ErrDigestMismatch", err)
	}
	r, err := s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if fl, err := r.File(ctx); fl != nil || !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("File (zero-copy serving): got %v, %v, want ErrDigestMismatch", fl, err)
	}
	r.Close()
	if trusted(s) {
		t.Fatal("after failed reads: got the blob trusted")
	}

	// The true bytes back in the same file: a new fingerprint, hashed
	// once, then trusted.
	flip(t, dir, f.SHA256)
	if trusted(s) {
		t.Fatal("after a second change: got the blob trusted before it was hashed")
	}
	got, _, err := s.ReadAll(ctx, run, "v.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read of the restored bytes: %d bytes, %v", len(got), err)
	}
	if !trusted(s) {
		t.Fatal("after a read that hashed true: got a blob to hash, want it trusted")
	}

	// A copy under a new inode, however faithful, is hashed before it is
	// trusted.
	p := blobPath(dir, f.SHA256)
	tmp := p + ".copy"
	if err := os.WriteFile(tmp, data, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	if trusted(s) {
		t.Fatal("after the file was replaced: got the blob trusted, want it hashed")
	}
	r, err = s.OpenBlob(ctx, f.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if fl, err := r.File(ctx); fl == nil || err != nil {
		t.Fatalf("File of a good replacement: got %v, %v", fl, err)
	}
	r.Close()
	if !trusted(s) {
		t.Fatal("after File hashed it true: got a blob to hash, want it trusted")
	}
}

// A damaged blob whose size is a whole number of read-ahead chunks still
// never yields its last chunk, read by Read or by WriteTo (where the end
// arrives as an empty read after the last full chunk).
func TestCorruptBlobAtChunkEdge(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	data := bytes.Repeat([]byte("0123456789abcdef"), 128<<10) // 2 MiB
	f, err := s.WriteBytes(ctx, runid.New(), "edge.bin", data)
	if err != nil {
		t.Fatal(err)
	}
	flip(t, dir, f.SHA256)
	for name, read := range map[string]func(r io.Reader) (int64, error){
		"Read":    func(r io.Reader) (int64, error) { b, err := io.ReadAll(r); return int64(len(b)), err },
		"WriteTo": func(r io.Reader) (int64, error) { return io.Copy(io.Discard, r) },
	} {
		r, err := s.OpenBlob(ctx, f.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		n, err := read(r)
		r.Close()
		if !errors.Is(err, tmpfs.ErrDigestMismatch) || n >= int64(len(data)) {
			t.Errorf("%s: got %d of %d bytes, %v, want the last chunk withheld and ErrDigestMismatch", name, n, len(data), err)
		}
	}
}

// extentOf returns the path of the one extent under dir.
func extentOf(t *testing.T, dir string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "extents", "*-*"))
	if err != nil || len(m) != 1 {
		t.Fatalf("got extents %v, %v, want one", m, err)
	}
	return m[0]
}

// A crash after an append's bytes reached the extent but before its ref
// did leaves bytes past the last blob. The next append (after a restart)
// never builds on them: it starts a new extent, and every version reads
// back right.
func TestAppendAfterTornExtent(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	var versions []tmpfs.File
	for _, line := range []string{"one\n", "two\n", "three\n"} {
		f, err := s.Append(ctx, run, "trace.jsonl", []byte(line))
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, f)
	}
	ext := extentOf(t, dir)
	f, err := os.OpenFile(ext, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("torn, never acknowledged\n")
	f.Close()

	s2 := open(t, dir)
	got, err := s2.Append(ctx, run, "trace.jsonl", []byte("four\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "one\ntwo\nthree\nfour\n"
	if got.SHA256 != tmpfs.DigestOf([]byte(want)) {
		t.Fatalf("got %s, want the digest of %q", got.SHA256.Short(), want)
	}
	b, _, err := s2.ReadAll(ctx, run, "trace.jsonl")
	if err != nil || string(b) != want {
		t.Fatalf("got %q, %v, want %q", b, err, want)
	}
	for i, v := range versions {
		r, err := s2.OpenBlob(ctx, v.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || int64(len(b)) != v.Size {
			t.Fatalf("version %d: got %q, %v", i, b, err)
		}
	}
}

// A byte changed in an extent on disk is never served: a read of any
// blob whose prefix covers it fails with ErrDigestMismatch.
func TestTamperedExtentIsNotServed(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	if _, err := s.Append(ctx, run, "CEL.md", []byte("# journal\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, run, "CEL.md", []byte("## Step 1\n")); err != nil {
		t.Fatal(err)
	}
	ext := extentOf(t, dir)
	b, err := os.ReadFile(ext)
	if err != nil {
		t.Fatal(err)
	}
	b[2] ^= 0x20
	if err := os.WriteFile(ext, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ReadAll(ctx, run, "CEL.md"); !errors.Is(err, tmpfs.ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
}

// A torn ref (a crash while it was written) left where an append's ref
// goes is replaced by that append, which then reads back right.
func TestAppendOverTornRef(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	if _, err := s.Append(ctx, run, "trace.jsonl", []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	want := "one\ntwo\n"
	h := tmpfs.DigestOf([]byte(want)).String()
	ref := filepath.Join(dir, "extents", "refs", h[:2], h)
	if err := os.MkdirAll(filepath.Dir(ref), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ref, []byte(`{"extent":"tr`), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, run, "trace.jsonl", []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	b, _, err := open(t, dir).ReadAll(ctx, run, "trace.jsonl")
	if err != nil || string(b) != want {
		t.Fatalf("got %q, %v, want %q", b, err, want)
	}
}

// refFile returns the path of appended blob d's ref and what it says.
func refFile(t *testing.T, dir string, d tmpfs.Digest) (string, map[string]any) {
	t.Helper()
	p := filepath.Join(dir, "extents", "refs", d.String()[:2], d.String())
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]any
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	return p, r
}

// fsck checks every version of an appended file in one read of its
// extent, and a byte damaged in the extent makes bad exactly the versions
// that hold it.
func TestFsckAppended(t *testing.T) {
	dir := t.TempDir()
	tmpfstest.RunFsckAppended(t, open(t, dir), func(t *testing.T, d tmpfs.Digest, off int64) {
		_, r := refFile(t, dir, d)
		tmpfstest.FlipFileByte(t, filepath.Join(dir, "extents", r["extent"].(string)), off)
	})
}

// A ref whose sha256 midstate was damaged (the next append would continue
// from it and name its bytes wrongly), and a ref that does not parse, are
// found by fsck and quarantined, while the bytes and the other versions
// are left alone.
func TestFsckAppendedRefs(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	vs := appendLines(t, s, run, "log.txt", 4, "line %d\n")
	p, r := refFile(t, dir, vs[1].SHA256)
	state, _ := base64.StdEncoding.DecodeString(r["state"].(string))
	state[len(state)-9] ^= 1 // in the midstate's words, not its length
	r["state"] = state
	rewrite := func(p string, data []byte) {
		t.Helper()
		os.Chmod(p, 0o600)
		if err := os.WriteFile(p, data, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := json.Marshal(r)
	rewrite(p, data)
	torn, _ := refFile(t, dir, vs[2].SHA256)
	rewrite(torn, []byte(`{"extent":`))

	rep, err := s.Fsck(ctx, tmpfs.FsckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[tmpfs.Digest]string{}
	for _, b := range rep.Bad {
		if !b.Quarantined {
			t.Errorf("%s not quarantined", b.SHA256.Short())
		}
		reasons[b.SHA256] = b.Reason
	}
	if len(reasons) != 2 || !strings.Contains(reasons[vs[1].SHA256], "midstate") || !strings.Contains(reasons[vs[2].SHA256], "ref") {
		t.Fatalf("fsck found %q, want the damaged midstate of %s and the torn ref of %s", reasons, vs[1].SHA256.Short(), vs[2].SHA256.Short())
	}
	for i, v := range vs {
		err := s.Verify(ctx, v.SHA256)
		if bad := i == 1 || i == 2; bad && !errors.Is(err, tmpfs.ErrQuarantined) || !bad && err != nil {
			t.Errorf("version %d after fsck: %v", i, err)
		}
	}
}

// fsck in another process (triad fsck beside a server) quarantines a
// damaged journal version; the server's next append to that file does not
// build on the damaged bytes from its memory of the chain: it fails with
// ErrQuarantined, and fsck finds no new bad version.
func TestAppendAfterOtherProcessQuarantined(t *testing.T) {
	dir := t.TempDir()
	server, fsck := open(t, dir), open(t, dir)
	ctx := t.Context()
	run := runid.New()
	var last tmpfs.File
	for i := range 3 {
		f, err := server.Append(ctx, run, "CEL.md", fmt.Appendf(nil, "## Step %d\n", i))
		if err != nil {
			t.Fatal(err)
		}
		last = f
	}
	_, r := refFile(t, dir, last.SHA256)
	tmpfstest.FlipFileByte(t, filepath.Join(dir, "extents", r["extent"].(string)), 3)
	if rep, err := fsck.Fsck(ctx, tmpfs.FsckOptions{}); err != nil || len(rep.Bad) != 3 {
		t.Fatalf("fsck: got %+v, %v, want the three versions bad", rep.Bad, err)
	}
	if _, err := server.Append(ctx, run, "CEL.md", []byte("## Step 3\n")); !errors.Is(err, tmpfs.ErrQuarantined) {
		t.Fatalf("append after the quarantine: got %v, want ErrQuarantined", err)
	}
	if rep, err := fsck.Fsck(ctx, tmpfs.FsckOptions{}); err != nil || len(rep.Bad) != 0 {
		t.Fatalf("second fsck: got %+v, %v, want nothing new", rep.Bad, err)
	}
}

// An extent cut short (a lost tail of the file) makes bad every version
// that reaches past the cut, in one read of the extent, and no other.
func TestFsckAppendedShortExtent(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	run := runid.New()
	vs := appendLines(t, s, run, "trace.jsonl", 5, "{\"step\":%d}\n")
	cut := vs[1].Size + 3
	if err := os.Truncate(extentOf(t, dir), cut); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Fsck(ctx, tmpfs.FsckOptions{})
	if err != nil || rep.Blobs != 5 || len(rep.Unreadable) != 0 {
		t.Fatalf("fsck: %+v, %v, want 5 versions checked", rep, err)
	}
	bad := map[tmpfs.Digest]string{}
	for _, b := range rep.Bad {
		bad[b.SHA256] = b.Reason
	}
	for i, v := range vs {
		reason, isBad := bad[v.SHA256]
		if want := v.Size > cut; isBad != want || isBad && !strings.Contains(reason, fmt.Sprintf("end after %d", cut)) {
			t.Errorf("version %d (%d bytes, cut at %d): bad=%v %q", i, v.Size, cut, isBad, reason)
		}
	}
}

// appendLines appends n lines, made by format from 0 to n-1, to path and
// returns each version.
func appendLines(t *testing.T, s *tmpfs.Store, run runid.ID, path string, n int, format string) []tmpfs.File {
	t.Helper()
	var vs []tmpfs.File
	for i := range n {
		f, err := s.Append(t.Context(), run, path, fmt.Appendf(nil, format, i))
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, f)
	}
	return vs
}

func TestCollect(t *testing.T) {
	dir := t.TempDir()
	tmpfstest.RunCollect(t, func(t *testing.T) *tmpfs.Store { return open(t, dir) })
}

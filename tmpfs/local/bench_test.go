package local_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/tmpfs"
)

// BenchmarkFsckJournal checks every version of a journal of 1,000 appends
// of 1 KiB (a long run's CEL.md) two ways in the same run: fsck, which
// reads the journal's extent once, and a check of each version as a blob
// of its own (Store.Verify on a fresh store, so nothing is cached), which
// is what fsck would cost if it walked versions one by one. It reports
// the ratio, and fsck against one hash of the final version's bytes.
func BenchmarkFsckJournal(b *testing.B) {
	const steps = 1000
	dir := b.TempDir()
	s := open(b, dir)
	ctx := b.Context()
	run := runid.New()
	line := append(bytes.Repeat([]byte("x"), 1023), '\n')
	var vs []tmpfs.File
	for range steps {
		f, err := s.Append(ctx, run, "CEL.md", line)
		if err != nil {
			b.Fatal(err)
		}
		vs = append(vs, f)
	}
	var fsck, each, one time.Duration
	for b.Loop() {
		t := time.Now()
		rep, err := open(b, dir).Fsck(ctx, tmpfs.FsckOptions{})
		fsck += time.Since(t)
		if err != nil || rep.Blobs != steps || len(rep.Bad) != 0 {
			b.Fatalf("fsck: %+v, %v", rep, err)
		}
		fresh := open(b, dir)
		t = time.Now()
		for _, v := range vs {
			if err := fresh.Verify(ctx, v.SHA256); err != nil {
				b.Fatal(err)
			}
		}
		each += time.Since(t)
		t = time.Now()
		if err := open(b, dir).Verify(ctx, vs[steps-1].SHA256); err != nil {
			b.Fatal(err)
		}
		one += time.Since(t)
	}
	b.ReportMetric(float64(fsck.Microseconds())/float64(b.N)/1000, "fsck-ms")
	b.ReportMetric(float64(each)/float64(fsck), "each-version/fsck")
	b.ReportMetric(float64(fsck)/float64(one), "fsck/one-hash")
	b.Logf("journal of %d versions, %d KiB", steps, vs[steps-1].Size>>10)
}

// BenchmarkReadSmall reads a 1 KiB journal (an appended file, which is
// hashed on every read) whole through the store's verifying reader, as GET
// /cel and a kernel's first copy of the journal do.
func BenchmarkReadSmall(b *testing.B) {
	dir := b.TempDir()
	s := open(b, dir)
	ctx := b.Context()
	run := runid.New()
	data := bytes.Repeat([]byte("a,b\n"), 256)
	f, err := s.Append(ctx, run, "CEL.md", data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r, err := s.OpenBlob(ctx, f.SHA256)
		if err != nil {
			b.Fatal(err)
		}
		var sink bytes.Buffer
		if _, err := sink.ReadFrom(r); err != nil || sink.Len() != len(data) {
			b.Fatalf("read %d bytes, %v", sink.Len(), err)
		}
		r.Close()
	}
}

// BenchmarkWriteSmall writes a 1 KiB file, as tmp.write does.
func BenchmarkWriteSmall(b *testing.B) {
	s := open(b, b.TempDir())
	ctx := b.Context()
	run := runid.New()
	data := bytes.Repeat([]byte("a,b\n"), 256)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		data[0] = byte(i) // a new blob each time, as distinct writes are
		data[1] = byte(i >> 8)
		if _, err := s.WriteBytes(ctx, run, "small.csv", data); err != nil {
			b.Fatal(err)
		}
	}
}

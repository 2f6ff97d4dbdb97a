package s3

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
)

// A large blob read from its start, from a store whose single stream is
// slower than the reader, is fetched as ranged GETs of segmentSize bytes,
// segmentsAhead of them in flight beside the stream the reader is
// consuming, each read into memory as it arrives and handed over in
// order. S3 serves one connection at a fraction of what a client can hash
// (tens to a few hundred MB/s), so parallel ranges are how its reads go
// faster; a store that streams faster than the reader consumes gains
// nothing from them and, on the same cores as the reader, costs it CPU.
// So the first probeBytes of the read time the stream (the time spent
// waiting in its Reads) and go parallel only below fastStream.
//
// The first segment comes from the stream Open started (cut short at the
// segment's end once the read goes parallel), so a read that stays one
// stream, or stops early, costs no extra request.
// Every segment is pinned to the ETag the blob was opened at, so a blob
// replaced mid-read fails with errReplaced rather than splicing versions.
// See docs/DECISIONS.md, "S3 reads: ranged GETs in parallel when the
// stream is slow".
const (
	parallelMin   = 16 << 20 // the smallest blob read in parallel
	segmentSize   = 8 << 20  // bytes per ranged GET
	segmentsAhead = 3        // buffered segments per reader
	probeBytes    = 2 << 20  // bytes streamed before deciding
	// maxSegments caps the segment buffers of all readers in the process
	// (64 MiB); a reader that finds none free reads as one stream.
	maxSegments = 8
)

// fastStream is the rate (bytes per second spent in Read) at or above
// which a stream is left alone. One S3 connection (~100 MB/s) is below
// it; a MinIO on the same machine (1-4 GB/s here, as fast as sha256
// hashes on one core) is above it, even on a busy machine (the slowest
// probe seen in bench/store was 560 MiB/s). A variable so tests can force
// either way.
var fastStream float64 = 256 << 20

// segmentSlots holds a token per segment buffer in use, process-wide.
var segmentSlots = make(chan struct{}, maxSegments)

// segmentPool recycles segment buffers across reads.
var segmentPool = sync.Pool{New: func() any { b := make([]byte, segmentSize); return &b }}

// parState is where an object stands on reading in parallel.
type parState uint8

const (
	parUnknown parState = iota // no read from the start yet
	parProbing                 // timing the stream's first probeBytes
	parOff                     // one stream: small, unpinned, fast, sought, or no buffers free
	parOn                      // a prefetch runs or ran
)

// prefetch is an object's parallel read: the segments fetched or being
// fetched ahead of the reader, in order.
type prefetch struct {
	ctx    context.Context // a child of the object's; ends every GET
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per fetch goroutine
	segs   []*segment     // segs[0] is the next to deliver
	next   int64          // offset of the first segment not yet started
	slots  int            // segmentSlots tokens held
}

// segment is one ranged GET read into buf. Its goroutine writes
// buf[:filled] and err; the reader reads buf[pos:filled].
type segment struct {
	off      int64
	n        int // bytes in the segment
	buf      *[]byte
	filled   atomic.Int64
	progress chan struct{} // a token after bytes arrive
	done     chan struct{} // closed when the GET ends; err is set before
	err      error
	pos      int // bytes delivered, the reader's
}

// pos is the offset the prefetch delivers next.
func (pf *prefetch) pos() int64 {
	if len(pf.segs) == 0 {
		return pf.next
	}
	return pf.segs[0].off + int64(pf.segs[0].pos)
}

// decide ends the probe: a stream that made the reader wait goes
// parallel from the next segment boundary, if buffers are free.
func (o *object) decide() {
	o.par = parOff
	if o.body == nil || o.off >= segmentSize {
		return
	}
	rate := float64(o.off) / max(o.probed, time.Nanosecond).Seconds()
	if rate >= fastStream {
		return
	}
	o.startPrefetch()
}

// startPrefetch takes up to segmentsAhead buffer tokens and starts fetching
// from the end of the open stream's first segment, which it limits to that
// segment. With no token free the blob stays one stream.
func (o *object) startPrefetch() {
	slots := 0
take:
	for slots < segmentsAhead {
		select {
		case segmentSlots <- struct{}{}:
			slots++
		default:
			break take
		}
	}
	if slots == 0 {
		return
	}
	o.par = parOn
	ctx, cancel := context.WithCancel(o.ctx)
	o.pf = &prefetch{ctx: ctx, cancel: cancel, next: segmentSize, slots: slots}
	o.bodyEnd = min(o.bodyEnd, segmentSize)
	o.fill()
}

// fill starts fetches until the prefetch holds a segment per token or none
// is left to start, and frees the tokens it no longer needs.
func (o *object) fill() {
	pf := o.pf
	for len(pf.segs) < pf.slots && pf.next < o.size {
		s := &segment{
			off:      pf.next,
			n:        int(min(segmentSize, o.size-pf.next)),
			buf:      segmentPool.Get().(*[]byte),
			progress: make(chan struct{}, 1),
			done:     make(chan struct{}),
		}
		pf.next += int64(s.n)
		pf.segs = append(pf.segs, s)
		pf.wg.Add(1)
		go func() {
			defer pf.wg.Done()
			o.fetch(pf.ctx, s)
		}()
	}
	for pf.slots > len(pf.segs) {
		<-segmentSlots
		pf.slots--
	}
}

// fetch reads segment s with a ranged GET pinned to the blob's ETag,
// publishing bytes as they arrive. It runs on its own goroutine and reads
// only what Open set.
func (o *object) fetch(ctx context.Context, s *segment) {
	defer close(s.done)
	var opts minio.GetObjectOptions
	opts.SetMatchETag(o.etag)
	opts.SetRange(s.off, s.off+int64(s.n)-1)
	body, cancel, _, err := o.request(ctx, opts)
	if err != nil {
		s.err = err
		return
	}
	defer cancel()
	defer body.Close()
	buf := (*s.buf)[:s.n]
	for got := 0; got < s.n; {
		k, err := body.Read(buf[got:])
		if k > 0 {
			got += k
			s.filled.Store(int64(got))
			select {
			case s.progress <- struct{}{}:
			default:
			}
		}
		if got == s.n {
			break
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			s.err = o.c.fail(o.ctx, "read blob "+o.short, err)
			return
		}
	}
}

// readAhead serves a Read from the prefetched segments.
func (o *object) readAhead(p []byte) (int, error) {
	pf := o.pf
	s := pf.segs[0]
	filled, err := s.wait()
	if err != nil {
		o.stopPrefetch()
		return 0, err
	}
	n := copy(p, (*s.buf)[s.pos:filled])
	s.pos += n
	o.off += int64(n)
	if s.pos == s.n {
		pf.segs = pf.segs[1:]
		segmentPool.Put(s.buf)
		o.fill()
	}
	if o.off >= o.size {
		o.stopPrefetch()
		return n, io.EOF
	}
	return n, nil
}

// wait blocks until s has bytes past pos, and returns how many it has, or
// its error.
func (s *segment) wait() (int, error) {
	for {
		if f := int(s.filled.Load()); f > s.pos {
			return f, nil
		}
		select {
		case <-s.done:
			if f := int(s.filled.Load()); f > s.pos {
				return f, nil
			}
			if s.err == nil {
				// Not reached: a GET that ends without an error filled
				// all n bytes, and a segment leaves segs once pos is n.
				return 0, io.ErrUnexpectedEOF
			}
			return 0, s.err
		case <-s.progress:
		}
	}
}

// stopPrefetch ends a parallel read, if one runs: it cancels the GETs,
// waits for their goroutines and frees the buffers and tokens.
func (o *object) stopPrefetch() {
	pf := o.pf
	if pf == nil {
		return
	}
	o.pf = nil
	pf.cancel()
	pf.wg.Wait()
	for _, s := range pf.segs {
		segmentPool.Put(s.buf)
	}
	for range pf.slots {
		<-segmentSlots
	}
}

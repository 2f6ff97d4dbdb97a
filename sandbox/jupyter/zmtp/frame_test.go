package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// reader returns a frameReader over data with lim.
func reader(data []byte, lim Limits) *frameReader {
	return &frameReader{r: bufio.NewReader(bytes.NewReader(data)), lim: lim.withDefaults(), name: "test"}
}

// long returns the header of a long frame announcing size bytes.
func long(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestReadMessage(t *testing.T) {
	t.Parallel()
	lim := Limits{MaxFrame: 1000, MaxMessage: 4000, MaxFrames: 8}
	big := bytes.Repeat([]byte("b"), 300)
	for _, tc := range []struct {
		name    string
		data    []byte
		frames  [][]byte
		command bool
		err     string // "" for success; a substring of the error otherwise
		violate bool   // the error is a *ViolationError
	}{
		{name: "one short frame", data: []byte{0, 3, 'a', 'b', 'c'}, frames: [][]byte{[]byte("abc")}},
		{name: "empty frame", data: []byte{0, 0}, frames: [][]byte{{}}},
		{name: "multipart", data: []byte{flagMore, 1, 'a', flagMore, 0, 0, 1, 'c'}, frames: [][]byte{[]byte("a"), {}, []byte("c")}},
		{name: "long frame", data: cat(long(0, 300), big), frames: [][]byte{big}},
		{name: "long encoding of a short size", data: cat(long(0, 2), []byte("hi")), frames: [][]byte{[]byte("hi")}},
		{name: "command", data: []byte{flagCommand, 5, 4, 'P', 'I', 'N', 'G'}, frames: [][]byte{[]byte("\x04PING")}, command: true},
		{name: "clean EOF", data: nil, err: io.EOF.Error()},

		{name: "2^62-byte frame", data: long(0, 1<<62), err: "frame of 4611686018427387904 bytes over the 1000-byte limit", violate: true},
		{name: "2^64-1-byte frame", data: long(0, 1<<64-1), err: "over the 1000-byte limit", violate: true},
		{name: "frame just over the limit", data: long(0, 1001), err: "frame of 1001 bytes", violate: true},
		{name: "message over the limit", data: cat(long(flagMore, 1000), bytes.Repeat([]byte("x"), 1000), long(flagMore, 1000), bytes.Repeat([]byte("x"), 1000), long(flagMore, 1000), bytes.Repeat([]byte("x"), 1000), long(0, 1000)),
			err: "message over the 4000-byte limit: frame 4 of 1000 bytes after 3096 bytes", violate: true},
		{name: "too many empty frames", data: bytes.Repeat([]byte{flagMore, 0}, 9), err: "more than 8 frames", violate: true},
		{name: "reserved flag bits", data: []byte{0x80, 0}, err: "reserved bits", violate: true},
		{name: "garbage", data: []byte("\xde\xad\xbe\xef"), err: "reserved bits", violate: true},
		{name: "command inside a message", data: []byte{flagMore, 0, flagCommand, 0}, err: "command frame inside a message", violate: true},
		{name: "command with MORE", data: []byte{flagCommand | flagMore, 0}, err: "MORE", violate: true},
		{name: "oversized command", data: long(flagCommand, maxCommand+1), err: "command of", violate: true},

		{name: "truncated header", data: []byte{flagLong, 0, 0}, err: "ended inside a message"},
		{name: "truncated body", data: []byte{0, 10, 'a'}, err: "frame 1, 1 of 10 bytes"},
		{name: "EOF after MORE", data: []byte{flagMore, 1, 'a'}, err: "ended inside a message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			frames, command, err := reader(tc.data, lim).readMessage()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				var v *ViolationError
				if got := errors.As(err, &v); got != tc.violate {
					t.Errorf("got violation %v (%v), want %v", got, err, tc.violate)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if command != tc.command {
				t.Errorf("got command %v, want %v", command, tc.command)
			}
			if diff := cmp.Diff(tc.frames, frames); diff != "" {
				t.Errorf("frames (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHugeFrameAllocatesNothing: the 9 bytes that took the server down
// (a long frame announcing 2^62 bytes) are refused without allocating the
// frame, and so are large announcements within the 64-bit range that
// would fit in memory.
func TestHugeFrameAllocatesNothing(t *testing.T) {
	for _, size := range []uint64{1 << 62, 1 << 40, DefaultMaxMessage + 1} {
		data := long(0, size)
		var err error
		grew := allocated(func() { _, _, err = reader(data, Limits{}).readMessage() })
		var v *ViolationError
		if !errors.As(err, &v) {
			t.Errorf("size %d: got %v, want a violation", size, err)
		}
		if grew > 1<<20 {
			t.Errorf("size %d: allocated %d bytes, want under 1 MiB (the bufio buffer and the error)", size, grew)
		}
	}
}

// allocated returns how many bytes of heap f allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestManyLargeFramesRefusedEarly: a message of frames that are each within
// the frame limit, but together over the message limit, is refused at the
// header of the first frame that would pass it, before that frame is read.
func TestManyLargeFramesRefusedEarly(t *testing.T) {
	const frame = 1 << 20
	lim := Limits{MaxMessage: 3<<20 + 1<<19}
	body := make([]byte, frame)
	var data []byte
	for range 8 {
		data = append(data, long(flagMore, frame)...)
		data = append(data, body...)
	}
	var err error
	grew := allocated(func() { _, _, err = reader(data, lim).readMessage() })
	if err == nil || !strings.Contains(err.Error(), "frame 4 of 1048576 bytes") {
		t.Fatalf("got %v, want a violation at frame 4", err)
	}
	if grew > uint64(lim.MaxMessage) {
		t.Errorf("allocated %d bytes, want at most the %d-byte message limit", grew, lim.MaxMessage)
	}
}

// FuzzReadFrame feeds arbitrary bytes to the frame reader. It must never
// panic, never allocate more than the message bound (plus the reader's
// bufio buffer), never return a message over its limits, and every message
// it returns must come back unchanged from an encode and a second read.
//
//	go test -run '^$' -fuzz '^FuzzReadFrame$' -fuzztime 30s ./sandbox/jupyter/zmtp
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 3, 'a', 'b', 'c'})
	f.Add([]byte{flagMore, 1, 'a', flagMore, 0, 0, 1, 'c'})
	f.Add(long(0, 1<<62))
	f.Add(cat(long(0, 300), bytes.Repeat([]byte("b"), 300)))
	f.Add([]byte{flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
	f.Add([]byte("\xde\xad\xbe\xef"))
	f.Add(bytes.Repeat([]byte{flagMore, 0}, 40))
	lim := Limits{MaxFrame: 4 << 10, MaxMessage: 16 << 10, MaxFrames: 32}.withDefaults()
	// What one read may allocate besides frame bodies (the frames slice,
	// an error) and what the fuzzing engine allocates meanwhile.
	const slack = 64 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		var msgs [][][]byte
		var commands []bool
		fr := reader(data, lim)
		for {
			var frames [][]byte
			var command bool
			var err error
			grew := allocated(func() { frames, command, err = fr.readMessage() })
			if max := uint64(lim.MaxMessage) + slack; grew > max {
				t.Fatalf("one read allocated %d bytes, want at most %d", grew, max)
			}
			if err != nil {
				break
			}
			msgs = append(msgs, frames)
			commands = append(commands, command)
		}
		for i, frames := range msgs {
			var total int64
			for _, fr := range frames {
				total += int64(len(fr)) + FrameOverhead
				if int64(len(fr)) > lim.MaxFrame && !commands[i] {
					t.Fatalf("message %d: frame of %d bytes over the %d-byte limit", i, len(fr), lim.MaxFrame)
				}
			}
			if total > lim.MaxMessage || len(frames) > lim.MaxFrames {
				t.Fatalf("message %d: %d frames, %d bytes: over the limits", i, len(frames), total)
			}
			var wire []byte
			if commands[i] {
				wire = appendHeader(nil, flagCommand, len(frames[0]))
				wire = append(wire, frames[0]...)
			} else {
				wire = appendMessage(nil, frames)
			}
			again, command, err := reader(wire, lim).readMessage()
			if err != nil {
				t.Fatalf("message %d: re-reading its encoding: %v", i, err)
			}
			if command != commands[i] || !cmp.Equal(again, frames) {
				t.Fatalf("message %d: round trip changed it: got %q (command %v), want %q (command %v)", i, again, command, frames, commands[i])
			}
		}
		// Any frames made from the input round-trip too.
		frames := bytes.Split(data, []byte{0xff})
		if len(frames) > lim.MaxFrames {
			frames = frames[:lim.MaxFrames]
		}
		wire := appendMessage(nil, frames)
		got, _, err := reader(wire, Limits{MaxMessage: int64(len(wire)) + FrameOverhead*int64(len(frames)), MaxFrames: lim.MaxFrames}).readMessage()
		if err != nil {
			t.Fatalf("reading %d frames just encoded: %v", len(frames), err)
		}
		if !cmp.Equal(got, frames, cmp.Comparer(bytes.Equal)) {
			t.Fatalf("round trip: got %q, want %q", got, frames)
		}
	})
}

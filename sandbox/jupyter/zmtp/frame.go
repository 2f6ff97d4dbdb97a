package zmtp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Frame flag bits (23/ZMTP, "Framing").
const (
	flagMore     = 0x01
	flagLong     = 0x02
	flagCommand  = 0x04
	flagReserved = 0xf8 // must be zero
)

// FrameOverhead is what each frame costs against Limits.MaxMessage on top
// of its body: its wire header and the slice that holds it. It bounds a
// message of many empty frames as firmly as one of a few large ones.
const FrameOverhead = 32

// Defaults of Limits.
const (
	DefaultMaxMessage = 64 << 20
	DefaultMaxFrames  = 1024
	DefaultStall      = 10 * time.Second
)

// maxCommand bounds a command frame. Commands (READY, PING, ERROR,
// SUBSCRIBE) carry a name and a few short properties.
const maxCommand = 64 << 10

// Limits bound what a Conn reads from its peer. Zero (or negative) fields
// take the defaults.
type Limits struct {
	// MaxFrame is the largest frame body accepted, in bytes. Zero, or more
	// than MaxMessage, means MaxMessage.
	MaxFrame int64
	// MaxMessage bounds one message: the sum of its frame bodies plus
	// FrameOverhead per frame. Zero means DefaultMaxMessage (64 MiB).
	MaxMessage int64
	// MaxFrames is the most frames one message may have. Zero means
	// DefaultMaxFrames (1024); a Jupyter message has six plus its routing
	// prefix and buffers.
	MaxFrames int
	// Stall is how long the peer may go without sending a byte once a
	// message has begun. The peer's ZMQ I/O thread writes a message as
	// fast as it is read, so a frame left unfinished this long is
	// truncated, not slow. Zero means DefaultStall (10 s). Between
	// messages a connection may be idle for ever.
	Stall time.Duration
}

// withDefaults fills the zero fields.
func (l Limits) withDefaults() Limits {
	if l.MaxMessage <= 0 {
		l.MaxMessage = DefaultMaxMessage
	}
	if l.MaxFrame <= 0 || l.MaxFrame > l.MaxMessage {
		l.MaxFrame = l.MaxMessage
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = DefaultMaxFrames
	}
	if l.Stall <= 0 {
		l.Stall = DefaultStall
	}
	return l
}

// ViolationError reports bytes from the peer that break ZMTP or the
// Limits. The connection is unusable after it: the stream is at an unknown
// position, so it is closed rather than resynchronised.
type ViolationError struct {
	// Conn names the connection (Options.Name), "" if unnamed.
	Conn string
	// Reason says what was wrong, e.g. "frame of 4611686018427387904
	// bytes over the 83886080-byte limit".
	Reason string
}

func (e *ViolationError) Error() string {
	if e.Conn == "" {
		return "protocol violation: " + e.Reason
	}
	return "protocol violation on the " + e.Conn + " socket: " + e.Reason
}

// frameReader reads frames and messages from a stream within its limits.
// All allocation of frame bodies happens in readMessage, after the checks.
type frameReader struct {
	r    *bufio.Reader
	lim  Limits
	name string // for ViolationError.Conn

	// begin is called once the first byte of a message has arrived, end
	// once the message is complete; the stall watchdog hooks them. Both
	// may be nil.
	begin, end func()
}

func (fr *frameReader) violation(format string, args ...any) error {
	return &ViolationError{Conn: fr.name, Reason: fmt.Sprintf(format, args...)}
}

// errTruncated marks a connection that ended inside a message.
var errTruncated = errors.New("connection ended inside a message")

// readMessage reads the next data message, or one command frame (command
// is then true and frames holds its body). An io.EOF between messages is
// returned as is: the peer closed cleanly. An end inside a message wraps
// errTruncated and io.ErrUnexpectedEOF.
//
// Invariant: every allocation is preceded by a check that keeps the
// message's total (bodies plus FrameOverhead each) within MaxMessage, a
// data frame within MaxFrame, a command within maxCommand, and the frame
// count within MaxFrames.
func (fr *frameReader) readMessage() (frames [][]byte, command bool, err error) {
	var total int64 // counted against MaxMessage
	begun := false
	defer func() {
		if begun && fr.end != nil {
			fr.end()
		}
	}()
	for {
		flags, err := fr.r.ReadByte()
		if err != nil {
			if len(frames) == 0 {
				return nil, false, err
			}
			return nil, false, fr.cut(err, len(frames), 0, 0)
		}
		if !begun {
			begun = true
			if fr.begin != nil {
				fr.begin()
			}
		}
		if flags&flagReserved != 0 {
			return nil, false, fr.violation("frame flags %#02x have reserved bits set", flags)
		}
		var size uint64
		if flags&flagLong != 0 {
			var b [8]byte
			if _, err := io.ReadFull(fr.r, b[:]); err != nil {
				return nil, false, fr.cut(err, len(frames), 0, 0)
			}
			size = binary.BigEndian.Uint64(b[:])
		} else {
			b, err := fr.r.ReadByte()
			if err != nil {
				return nil, false, fr.cut(err, len(frames), 0, 0)
			}
			size = uint64(b)
		}
		if flags&flagCommand != 0 {
			switch {
			case len(frames) > 0:
				return nil, false, fr.violation("command frame inside a message, after %d frames", len(frames))
			case flags&flagMore != 0:
				return nil, false, fr.violation("command frame with the MORE flag set")
			case size > maxCommand:
				return nil, false, fr.violation("command of %d bytes over the %d-byte limit", size, maxCommand)
			}
		} else {
			switch {
			case len(frames) >= fr.lim.MaxFrames:
				return nil, false, fr.violation("message of more than %d frames", fr.lim.MaxFrames)
			case size > uint64(fr.lim.MaxFrame):
				return nil, false, fr.violation("frame of %d bytes over the %d-byte limit", size, fr.lim.MaxFrame)
			case total+int64(size)+FrameOverhead > fr.lim.MaxMessage:
				// size <= MaxFrame <= MaxMessage, so the sum cannot overflow.
				return nil, false, fr.violation("message over the %d-byte limit: frame %d of %d bytes after %d bytes", fr.lim.MaxMessage, len(frames)+1, size, total)
			}
		}
		body := make([]byte, size)
		if n, err := io.ReadFull(fr.r, body); err != nil {
			return nil, false, fr.cut(err, len(frames), n, size)
		}
		total += int64(size) + FrameOverhead
		frames = append(frames, body)
		if flags&flagCommand != 0 {
			return frames, true, nil
		}
		if flags&flagMore == 0 {
			return frames, false, nil
		}
	}
}

// cut describes a read error inside a message.
func (fr *frameReader) cut(err error, frame, got int, size uint64) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w (frame %d, %d of %d bytes): %w", errTruncated, frame+1, got, size, err)
}

// appendHeader appends the wire header of a frame of size bytes.
func appendHeader(dst []byte, flags byte, size int) []byte {
	if size > 255 {
		dst = append(dst, flags|flagLong)
		return binary.BigEndian.AppendUint64(dst, uint64(size))
	}
	return append(dst, flags, byte(size))
}

// appendMessage appends frames as one message (MORE on all but the last).
func appendMessage(dst []byte, frames [][]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		dst = appendHeader(dst, flags, len(f))
		dst = append(dst, f...)
	}
	return dst
}

// appendCommand appends a command frame: name, then body.
func appendCommand(dst []byte, name string, body []byte) []byte {
	dst = appendHeader(dst, flagCommand, 1+len(name)+len(body))
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	return append(dst, body...)
}

// parseCommand splits a command frame's body into its name and data.
func parseCommand(b []byte) (name string, data []byte, ok bool) {
	if len(b) == 0 || int(b[0]) > len(b)-1 || b[0] == 0 {
		return "", nil, false
	}
	n := int(b[0])
	return string(b[1 : 1+n]), b[1+n:], true
}

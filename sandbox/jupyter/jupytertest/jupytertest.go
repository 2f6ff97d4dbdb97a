// Package jupytertest writes hostile cells: Python that breaks the wire protocol from inside a kernel, for tests of the clients that must survive it.
//
// A cell runs in the kernel's process, which holds the kernel's end of every
// connection a client made to its sockets. Cell finds those ends the way an
// attacker would: among the sockets in /proc/self/fd, an accepted connection
// is named after its listener (getsockname; under gVisor's --host-uds, a
// host connection names it as its peer), and SO_PEERCRED tells the host's
// connections from the kernel's own. It writes raw bytes to them,
// interleaved with nothing: it waits for the kernel's own output to drain
// first and prints nothing itself.
package jupytertest

import (
	"fmt"
	"strconv"
)

// Attack is what a hostile cell writes to the kernel's end of a connection.
type Attack string

// The attacks.
const (
	// HugeFrame is the 9-byte header of a long frame announcing 2^62
	// bytes.
	HugeFrame Attack = "huge frame"
	// Garbage is 64 bytes that are not ZMTP at all.
	Garbage Attack = "garbage"
	// Truncated is a frame header announcing 100 bytes followed by 10 of
	// them, and then silence.
	Truncated Attack = "truncated frame"
	// ManyFrames is one message of 8 long frames of Cell's frameSize
	// bytes each, all written from one buffer.
	ManyFrames Attack = "many large frames"
)

// Attacks lists every Attack.
var Attacks = []Attack{HugeFrame, Garbage, Truncated, ManyFrames}

// Cell returns a cell that writes a to every connection of the kernel's
// socket bound at path (the path as the kernel sees it, e.g.
// /run/kernel/k-1), then sleeps for an hour so that what the client sees
// next is the attack and not the cell's reply. frameSize sets ManyFrames'
// frame size. The cell raises RuntimeError if it finds no connection.
func Cell(a Attack, path string, frameSize int) string {
	var payload string
	switch a {
	case HugeFrame:
		payload = `_write(bytes([0x02]) + (1 << 62).to_bytes(8, "big"))`
	case Garbage:
		payload = `_write(b"\xde\xad\xbe\xef" * 16)`
	case Truncated:
		payload = `_write(bytes([0x00, 100]) + b"0123456789")`
	case ManyFrames:
		payload = fmt.Sprintf(`_buf = bytearray(%d)
for _i in range(8):
    if not (_write(bytes([0x02 | (0x01 if _i < 7 else 0)]) + len(_buf).to_bytes(8, "big")) and _write(memoryview(_buf))):
        break`, frameSize)
	default:
		panic("jupytertest: unknown attack " + string(a))
	}
	return fmt.Sprintf(`import os, select, socket, struct, time
def _peer(s):
    try:
        return s.getpeername()
    except OSError:
        return None
def _host_ends(path):
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink("/proc/self/fd/%%d" %% fd).startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            # An accepted connection is named after its listener (under
            # gVisor's --host-uds, a connection from the host names the
            # listener as its peer instead); the listener itself accepts;
            # and the kernel's own connections to its sockets have the
            # kernel as their peer.
            if s.family != socket.AF_UNIX or path not in (s.getsockname(), _peer(s)):
                continue
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if pid != os.getpid():
                fds.append(fd)
        except OSError:
            pass
        finally:
            s.close()
    if not fds:
        raise RuntimeError("no connection to " + path)
    return fds
_fds = _host_ends(%s)
def _write(data):
    # libzmq's descriptors are non-blocking; a closed peer ends the attack.
    for fd in _fds:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                select.select([], [fd], [], 1)
            except (BrokenPipeError, ConnectionResetError):
                return False
    return True
time.sleep(0.5)  # let the kernel's busy and execute_input broadcasts drain
%s
time.sleep(3600)
`, strconv.Quote(path), payload)
}

package image

// KernelLauncher is the image's kernel launcher for both backends (sandbox/docker
// and sandbox/kube): ipykernel_launcher (the working directory leaves sys.path,
// then the kernel app starts) with one change: a cell's stdout and stderr
// are flushed to the host once 1 MiB is pending, instead of only every
// 0.2 s. A print loop holds the GIL, so the flushing thread rarely runs,
// and ipykernel would otherwise send hundreds of MiB as one message, which
// the host must receive whole (a 64 MiB-limited flood cost 1.8 GiB of the
// server's memory). Flushing from the writer blocks it until the message
// is sent: back-pressure on the cell. It is a courtesy, not a boundary (a
// cell can undo it); the host's output limit and the client's own bounds
// are what hold. Written without single quotes: it is quoted for sh.
const KernelLauncher = `import sys
sys.path[:] = [p for p in sys.path if p not in ("", "/work")]
try:
    from ipykernel import iostream as _io
    def _bounded(write):
        def bounded_write(self, s):
            n = write(self, s)
            try:
                if sum(b.tell() for b in list(self._buffers.values())) >= 1 << 20:
                    self.flush()
            except Exception:
                pass
            return n
        return bounded_write
    _io.OutStream.write = _bounded(_io.OutStream.write)
    del _io, _bounded
except Exception as e:
    print("triad: could not bound ipykernel output buffers:", e, file=sys.stderr)
from ipykernel import kernelapp
kernelapp.launch_new_instance()
`

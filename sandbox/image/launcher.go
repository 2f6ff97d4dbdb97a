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
// are what hold.
//
// Two packages are kept out of the kernel's start: debugpy (ipykernel's
// debugger, which Triad never asks for) and jedi (IPython's completer,
// which Triad never asks for either). While the kernel initialises, an
// import of either fails, so ipykernel starts without a debugger and
// IPython completes without jedi; once the kernel is up the block is
// removed, so a cell may still import them. That is 228 modules fewer:
// about 15% of a start's CPU and 12 MiB of each idle kernel's memory
// (docs/DECISIONS.md, "Kernel start imports").
//
// Once the kernel is up, triad_display (sandbox/image/python, on
// PYTHONPATH) adds the chart and data displays and PIL's save hook.
//
// Written without single quotes: it is quoted for sh.
const KernelLauncher = `import sys
sys.path[:] = [p for p in sys.path if p not in ("", "/work", "/home/user")]
class _Deferred:
    names = ("debugpy", "jedi")
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError("not imported at kernel start: " + name, name=name)
        return None
_deferred = _Deferred()
sys.meta_path.insert(0, _deferred)
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
_app = kernelapp.IPKernelApp.instance()
try:
    _app.initialize()
finally:
    sys.meta_path.remove(_deferred)
    del _Deferred, _deferred
try:
    import triad_display
    triad_display.register(_app.shell)
    del triad_display
except Exception as e:
    print("triad: rich displays (charts, data) unavailable:", e, file=sys.stderr)
_app.start()
`

# Triad's kernel driver for CPython on WASI (sandbox/wasm).
#
# The Go host starts python.wasm with a tiny bootstrap (see kernel.go) that
# reads this file's source as the first stdin frame and execs it. Protocol:
#
#   stdin   frames of a 4-byte big-endian length and that many bytes (lengths
#           count bytes, so stdin is read as bytes): first b"NONCE", then one
#           b"N\n" + UTF-8 code per cell.
#   stdout  frames of b"\x1eTRIAD:" + nonce + b":" + decimal length + b"\n"
#           + that many bytes of UTF-8 JSON: "stream" and "display" as the
#           cell produces them, then one "result". Everything a cell prints
#           goes through sys.stdout/sys.stderr into the JSON, never raw onto
#           fd 1, so printed bytes cannot look like a frame; bytes a cell
#           writes to fd 1 directly (os.write) do not carry the nonce, and
#           the host counts them as that cell's stdout.
#
# The host trusts none of this for its limits (see kernel.go): it counts
# every byte written to fd 1 and 2 against the cell's output limit and fails
# writes past it (OSError here), it times the cell itself, and it takes the
# cell to be over only when this driver blocks reading stdin again. A cell
# can find the nonce and forge frames; all it can forge is its own output.
#
# Start-up time is most of a new kernel's cost, and in wasm every imported
# module costs milliseconds, so the driver imports only C modules and what
# the interpreter has already loaded (no ast, json, re or tokenize); the rest
# is imported on the error path, when it is needed.
#
# The cell namespace is a module named __main__ (as in IPython), separate from
# this driver's own state, which lives in closures.


def _triad_driver():
    import _ast
    import binascii
    import builtins
    import io
    import os
    import sys
    import time
    from _json import encode_basestring as json_str

    stdin = sys.stdin.buffer
    driver_files = {"<triad-driver>", "<string>"}
    cell_lines = {}  # "<cell-N>" -> the cell's source lines, for tracebacks

    def read_exact(n):
        chunks = []
        while n > 0:
            b = stdin.read(n)
            if not b:
                return None
            chunks.append(b)
            n -= len(b)
        return b"".join(chunks)

    def read_frame():
        hdr = read_exact(4)
        if hdr is None:
            return None
        return read_exact(int.from_bytes(hdr, "big"))

    hello = read_frame()
    if hello is None:
        return
    nonce = hello.decode("ascii").strip()
    marker = b"\x1eTRIAD:" + nonce.encode("ascii") + b":"

    def to_json(o):
        # A JSON encoder for what frames hold (str, int, float, bool, None,
        # list, tuple, dict with str keys), without importing json (and re).
        if o is None:
            return "null"
        if o is True:
            return "true"
        if o is False:
            return "false"
        if isinstance(o, str):
            return json_str(o)
        if isinstance(o, int):
            return int.__repr__(o)
        if isinstance(o, float):
            if o != o or o in (float("inf"), float("-inf")):
                return "null"
            return float.__repr__(o)
        if isinstance(o, (list, tuple)):
            return "[" + ",".join(to_json(v) for v in o) + "]"
        if isinstance(o, dict):
            return "{" + ",".join(json_str(str(k)) + ":" + to_json(v) for k, v in o.items()) + "}"
        raise TypeError("%s is not JSON serializable" % type(o).__name__)

    def write_frame(obj):
        # Lone surrogates pass as they are; the host replaces them.
        body = to_json(obj).encode("utf-8", "surrogatepass")
        data = memoryview(marker + str(len(body)).encode("ascii") + b"\n" + body)
        while data:
            n = os.write(1, data)
            data = data[n:]

    class Capture(io.TextIOBase):
        """A per-cell sys.stdout/sys.stderr, streamed to the host in chunks:
        when 8 KiB are pending, when a line ends 0.1 s after the last chunk,
        before the cell sleeps, and at its end. The host bounds the total."""

        def __init__(self, name):
            self.name = "<" + name + ">"
            self._stream = name
            self._pending = []
            self._pending_len = 0
            self._last_flush = time.monotonic()

        encoding = "utf-8"
        errors = "backslashreplace"

        def writable(self):
            return True

        def isatty(self):
            return False

        def fileno(self):
            raise io.UnsupportedOperation("fileno: the sandbox captures this stream")

        def close(self):
            # A cell closing sys.stdout must not break later cells.
            pass

        @property
        def closed(self):
            return False

        @property
        def buffer(self):
            return _BytesView(self)

        def write(self, s):
            if not isinstance(s, str):
                raise TypeError("write() argument must be str, not " + type(s).__name__)
            if s:
                self._pending.append(s)
                self._pending_len += len(s)
                if self._pending_len >= 8192 or (
                    "\n" in s and time.monotonic() - self._last_flush >= 0.1
                ):
                    self.flush()
            return len(s)

        def flush(self):
            if self._pending:
                text = "".join(self._pending)
                self._pending = []
                self._pending_len = 0
                write_frame({"t": "stream", "name": self._stream, "text": text})
            self._last_flush = time.monotonic()


    class _BytesView(io.RawIOBase):
        def __init__(self, cap):
            self._cap = cap

        def writable(self):
            return True

        def write(self, b):
            self._cap.write(bytes(b).decode("utf-8", "backslashreplace"))
            return len(b)

    class Quiet(io.TextIOBase):
        # sys.stdout between cells: the driver itself never prints.
        def writable(self):
            return True

        def write(self, s):
            return len(s)

    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    ns = main.__dict__
    captures = []  # the running cell's stdout and stderr

    def flush_captures():
        for c in captures:
            c.flush()

    real_sleep = time.sleep

    def sleep(seconds):
        """time.sleep, which first sends what the cell printed: while the
        guest sleeps, nothing else can."""
        flush_captures()
        real_sleep(seconds)

    sleep.__doc__ = real_sleep.__doc__
    time.sleep = sleep

    def mime_bundle(obj):
        data = {"text/plain": repr(obj)}
        if isinstance(obj, type):
            return {"data": data, "metadata": {}}
        metadata = {}
        for meth, mime in (
            ("_repr_html_", "text/html"),
            ("_repr_markdown_", "text/markdown"),
            ("_repr_svg_", "image/svg+xml"),
            ("_repr_png_", "image/png"),
            ("_repr_jpeg_", "image/jpeg"),
            ("_repr_latex_", "text/latex"),
            ("_repr_json_", "application/json"),
        ):
            f = getattr(obj, meth, None)
            if not callable(f):
                continue
            try:
                r = f()
            except Exception as e:  # IPython also skips a failing formatter
                print("%s failed: %r" % (meth, e), file=sys.stderr)
                continue
            if r is None:
                continue
            if isinstance(r, tuple) and len(r) == 2:
                r, md = r
                metadata[mime] = md
            if isinstance(r, (bytes, bytearray)):
                r = binascii.b2a_base64(r, newline=False).decode("ascii")
            data[mime] = r
        return {"data": data, "metadata": metadata}

    def display(*objs, **kwargs):
        """Show objects as rich output (IPython's display, without its options)."""
        for obj in objs:
            bundle = mime_bundle(obj)
            flush_captures()  # keep the order the cell produced them in
            write_frame({"t": "display", "data": bundle["data"], "metadata": bundle["metadata"]})

    builtins.display = display

    def ends_with_semicolon(code, node):
        # IPython's rule: a ';' after the last expression hides its value.
        # Column offsets are in UTF-8 bytes.
        lines = code.splitlines(True)
        rest = lines[node.end_lineno - 1].encode("utf-8")[node.end_col_offset :]
        rest = rest.decode("utf-8", "replace") + "".join(lines[node.end_lineno :])
        return rest.lstrip().startswith(";")

    def cell_name(filename):
        if filename.startswith("<cell-") and filename.endswith(">"):
            return filename[6:-1]
        return None

    def format_frame(frame, lineno):
        code = frame.f_code
        n = cell_name(code.co_filename)
        if n is not None:
            head = "Cell In[%s], line %d" % (n, lineno)
        else:
            head = "File %s:%d" % (code.co_filename, lineno)
        if n is None or code.co_name != "<module>":
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if code.co_flags & 0x04:
                names += ("*" + code.co_varnames[len(names)],)
            head += ", in %s(%s)" % (code.co_qualname, ", ".join(names))
        lines = cell_lines.get(code.co_filename)
        if lines is None:
            import linecache

            lines = linecache.getlines(code.co_filename, frame.f_globals)
        out = [head]
        if lines and lineno:
            lo = max(1, lineno - 2)
            hi = min(len(lines), lineno + 2)
            for i in range(lo, hi + 1):
                num = str(i)
                if i == lineno:
                    prefix = "-" * max(1, 5 - len(num)) + "> " + num
                else:
                    prefix = num.rjust(7)
                out.append(prefix + " " + lines[i - 1].rstrip("\n"))
        return "\n".join(out) + "\n"

    def format_one(e):
        ename = type(e).__name__
        evalue = str(e)
        if isinstance(e, SyntaxError):
            parts = __import__("traceback").format_exception_only(type(e), e)
            first = parts[0]
            n = cell_name(e.filename or "")
            if n is not None:
                first = "  Cell In[%s], line %s\n" % (n, e.lineno)
            return [first + "".join(parts[1:-1]), parts[-1].rstrip("\n")]
        entries = [
            "-" * 75,
            ename + " " * max(1, 75 - len(ename) - 33) + "Traceback (most recent call last)",
        ]
        frames = []
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename not in driver_files:
                frames.append((tb.tb_frame, tb.tb_lineno))
            tb = tb.tb_next
        # Like IPython, show a run of identical frames (deep recursion) as
        # its first and last frame around one "skipping" line.
        i = 0
        while i < len(frames):
            frame, lineno = frames[i]
            key = (frame.f_code, lineno)
            j = i
            while j + 1 < len(frames) and (frames[j + 1][0].f_code, frames[j + 1][1]) == key:
                j += 1
            entries.append(format_frame(frame, lineno))
            if j - i >= 3:
                entries.append(
                    "    [... skipping similar frames: %s at line %d (%d times)]"
                    % (frame.f_code.co_qualname, lineno, j - i - 1)
                )
                entries.append(format_frame(frames[j][0], frames[j][1]))
            else:
                for f, ln in frames[i + 1 : j + 1]:
                    entries.append(format_frame(f, ln))
            i = j + 1
        entries.append(ename + (": " + evalue if evalue else ""))
        return entries

    def format_error(e):
        chain = []
        seen = set()
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            chain.append(e)
            if e.__cause__ is not None:
                e = e.__cause__
            elif e.__context__ is not None and not e.__suppress_context__:
                e = e.__context__
            else:
                e = None
        traceback = []
        for i, exc in enumerate(reversed(chain)):
            if i:
                if exc.__cause__ is not None:
                    traceback.append(
                        "\nThe above exception was the direct cause of the following exception:\n"
                    )
                else:
                    traceback.append(
                        "\nDuring handling of the above exception, another exception occurred:\n"
                    )
            traceback.extend(format_one(exc))
        top = chain[0]
        return {"ename": type(top).__name__, "evalue": str(top), "traceback": traceback}

    def remember(filename, code):
        # Cell sources go to linecache too (as IPython does), so inspect and
        # traceback find them, but only once a cell has imported linecache.
        lines = code.splitlines(True)
        cell_lines[filename] = lines
        lc = sys.modules.get("linecache")
        if lc is not None:
            for name, ls in cell_lines.items():
                lc.cache.setdefault(name, (sum(map(len, ls)), None, ls, name))

    def run_cell(n, code):
        filename = "<cell-%d>" % n
        remember(filename, code)
        out, err = Capture("stdout"), Capture("stderr")
        captures[:] = [out, err]
        result = {"t": "result", "n": n, "ok": True}
        sys.stdout, sys.stderr = out, err
        try:
            if os.getcwd() != work:
                os.chdir(work)
            tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            last = None
            if tree.body and isinstance(tree.body[-1], _ast.Expr):
                last = tree.body.pop()
                if ends_with_semicolon(code, last):
                    tree.body.append(last)
                    last = None
            # No top-level await: asyncio's event loop needs a socketpair,
            # which WASI does not have.
            if tree.body:
                exec(compile(tree, filename, "exec", dont_inherit=True), ns)
            if last is not None:
                expr = _ast.Expression(last.value)
                value = eval(compile(expr, filename, "eval", dont_inherit=True), ns)
                if value is not None:
                    ns["_"] = value
                    result["value"] = mime_bundle(value)
        except BaseException as e:  # SystemExit and KeyboardInterrupt included, as in IPython
            result["ok"] = False
            try:
                result["error"] = format_error(e)
            except BaseException as fe:
                result["error"] = {
                    "ename": type(e).__name__,
                    "evalue": str(e),
                    "traceback": ["(formatting the traceback failed: %r)" % (fe,)],
                }
        finally:
            sys.stdout, sys.stderr = quiet, quiet
        if "linecache" in sys.modules:
            remember(filename, code)  # the cell may have imported it
        try:
            flush_captures()
        except BaseException:  # over the output limit: the host knows
            pass
        del captures[:]
        return result

    quiet = Quiet()
    sys.stdin = io.StringIO("")  # cells get EOF, never the control channel
    sys.stdout, sys.stderr = quiet, quiet
    # A context (sandbox.Contexts) starts its cells in a directory of its
    # own under /work, made if missing; the kernel in /work itself.
    work = os.environ.pop("TRIAD_CWD", "") or "/work"
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    if "" not in sys.path:
        sys.path.insert(0, "")
    write_frame({"t": "ready", "version": sys.version})
    while True:
        frame = read_frame()
        if frame is None:
            return
        head, _, code = frame.partition(b"\n")
        req = {"n": int(head)}
        try:
            res = run_cell(req["n"], code.decode("utf-8", "surrogateescape"))
        except BaseException as e:  # the driver must answer every cell
            res = {
                "t": "result",
                "n": req.get("n", 0),
                "ok": False,
                "error": {"ename": type(e).__name__, "evalue": str(e), "traceback": []},
            }
        try:
            try:
                write_frame(res)
            except (TypeError, ValueError) as e:
                write_frame(
                    {
                        "t": "result",
                        "n": req["n"],
                        "ok": False,
                        "error": {
                            "ename": type(e).__name__,
                            "evalue": "the result could not be encoded: %s" % e,
                            "traceback": [],
                        },
                    }
                )
        except OSError:
            pass  # the host refuses output past the cell's limit, and knows it


try:
    _triad_driver()
except BaseException:
    # The driver itself failed: say why on the real stderr, where the host
    # reads the reason a kernel died.
    import sys
    import traceback

    sys.stderr = sys.__stderr__
    traceback.print_exc()
    sys.__stderr__.flush()
    raise

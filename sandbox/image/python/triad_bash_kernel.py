"""A Jupyter kernel for bash, written for Triad's sandbox image.

One bash process lives as long as the kernel, so variables, functions, the
current directory and exported variables carry from one cell to the next.
A cell's source is written to a file under $TMPDIR and sourced by that
shell; its stdout and stderr stream to the client as they are written, and
its exit status ends the cell: zero is ok, anything else an error whose
evalue says the status (a command that fails part way does not stop the
cell, as in a script without `set -e`). An interrupt (SIGINT, how Triad
stops a cell) goes to every process of the cell; the shell itself traps it
and lives on. A cell that ends the shell (`exit`) ends the kernel, which
the host reports as a death and restarts.

Started as `python3 -m triad_bash_kernel -f CONNECTION_FILE`. Debian has no
bash kernel package; see docs/DECISIONS.md, "Kernels in more languages".
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

# The marker ends each cell's output on both streams; it is unguessable per
# kernel, so no output can imitate it.
_MARK = "__triad_cell_end_" + uuid.uuid4().hex


class BashKernel(Kernel):
    implementation = "triad_bash"
    implementation_version = "1"
    language = "bash"
    language_version = "5"
    language_info = {
        "name": "bash",
        "mimetype": "text/x-sh",
        "file_extension": ".sh",
        "codemirror_mode": "shell",
    }
    banner = "bash (Triad)"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._dir = tempfile.mkdtemp(prefix="triad-bash-")
        self._cells = 0
        # Its own session, so an interrupt can reach every process of a
        # cell (the shell's process group) without reaching the kernel.
        self._bash = subprocess.Popen(
            ["/bin/bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            bufsize=0,
        )
        # The shell outlives a SIGINT aimed at its cell; its children get
        # the default action again (a trap, unlike an ignore, is not
        # inherited). Job control stays off: a cell's processes share the
        # shell's process group.
        self._send("trap ':' INT\n")

    def _send(self, text):
        self._bash.stdin.write(text.encode())
        self._bash.stdin.flush()

    def _pump(self, pipe, name, status):
        """Streams pipe to the client until the marker line; for stdout the
        marker carries the exit status."""
        pending = b""
        mark = _MARK.encode()
        while True:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                status["eof"] = True
                if pending:
                    self._stream(name, pending)
                return
            pending += chunk
            i = pending.find(mark)
            if i >= 0:
                text = pending[:i]
                # The marker is printed after a newline the cell's output
                # may not have had: drop the one the marker added.
                if text.endswith(b"\n"):
                    text = text[:-1]
                if text:
                    self._stream(name, text)
                rest = pending[i + len(mark):].split(b"\n", 1)[0].strip()
                if rest:
                    status["code"] = int(rest)
                return
            # Keep back what could be the start of a marker.
            keep = len(mark) + 1
            if len(pending) > keep:
                self._stream(name, pending[:-keep])
                pending = pending[-keep:]

    def _stream(self, name, data):
        self.send_response(self.iopub_socket, "stream", {"name": name, "text": data.decode("utf-8", "replace")})

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, *, cell_id=None):
        if self._bash.poll() is not None:
            return self._died()
        self._cells += 1
        path = os.path.join(self._dir, "cell-%d.sh" % self._cells)
        with open(path, "w") as f:
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        status = {}
        readers = [
            threading.Thread(target=self._pump, args=(self._bash.stdout, "stdout", status)),
            threading.Thread(target=self._pump, args=(self._bash.stderr, "stderr", {})),
        ]
        for r in readers:
            r.start()
        self._send(
            ". %s\n__triad_rc=$?\nprintf '\\n%s %%d\\n' \"$__triad_rc\"\nprintf '\\n%s\\n' >&2\n"
            % (_quote(path), _MARK, _MARK)
        )
        try:
            for r in readers:
                while r.is_alive():
                    r.join(0.1)
        except KeyboardInterrupt:
            # Stop the cell's processes; the shell traps SIGINT and goes on
            # to print the marker, which the readers still wait for.
            try:
                os.killpg(self._bash.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            for r in readers:
                r.join()
            os.remove(path)
            if status.get("eof"):
                return self._died()
            return self._error("KeyboardInterrupt", "the cell was interrupted")
        os.remove(path)
        if status.get("eof"):
            return self._died()
        code = status.get("code", 0)
        if code != 0:
            return self._error("ExitCode", "exit status %d" % code)
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

    def _error(self, ename, evalue):
        content = {"ename": ename, "evalue": evalue, "traceback": ["%s: %s" % (ename, evalue)]}
        self.send_response(self.iopub_socket, "error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def _died(self):
        # The shell exited (a cell ran `exit`): so does the kernel, and the
        # host restarts it. The reply goes first so the cell gets its answer.
        self._bash.wait()
        threading.Timer(0.5, lambda: os._exit(0)).start()
        return self._error("ShellExited", "the shell exited with status %d; the kernel restarts" % self._bash.returncode)

    def do_shutdown(self, restart):
        try:
            os.killpg(self._bash.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return {"status": "ok", "restart": restart}


def _quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=BashKernel)

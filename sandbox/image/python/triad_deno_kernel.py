"""Runs Deno's Jupyter kernel (JavaScript and TypeScript) behind ipc sockets.

Triad reaches every kernel over ZeroMQ ipc sockets in a directory shared
with the host (the container has no network). `deno jupyter --kernel`
binds tcp only, so this relay writes Deno a tcp connection file on the
container's own loopback, starts it, and joins each of the five ipc socket
paths of Triad's connection file to the matching loopback port, byte for
byte (ZMTP is the same over either stream). Nothing outside the container
can reach loopback: with network mode none it is the container's alone.

The relay is the process the host signals: SIGINT goes on to Deno (its
kernel interrupts the cell), and when the relay dies Deno dies with it
(PR_SET_PDEATHSIG). When Deno exits, the relay exits with its status.

    python3 -m triad_deno_kernel CONNECTION_FILE

See docs/DECISIONS.md, "Kernels in more languages".
"""

import asyncio
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

CHANNELS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def _relay(path, port):
    async def accept(r, w):
        # Deno binds before it answers; a connection that comes first is
        # retried until it does.
        for _ in range(600):
            try:
                tr, tw = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            w.close()
            return
        await asyncio.gather(_pipe(r, tw), _pipe(tr, w))

    return await asyncio.start_unix_server(accept, path=path)


async def main(conn_file):
    with open(conn_file) as f:
        info = json.load(f)
    if info.get("transport") != "ipc":
        raise SystemExit("triad_deno_kernel: the connection file must use transport ipc")
    tcp = dict(info, transport="tcp", ip="127.0.0.1")
    for ch in CHANNELS:
        tcp[ch] = _free_port()
    fd, tcp_file = tempfile.mkstemp(prefix="deno-conn-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(tcp, f)
    servers = []
    for ch in CHANNELS:
        path = "%s-%s" % (info["ip"], info[ch])
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        servers.append(await _relay(path, tcp[ch]))
    # NO_COLOR: results as plain text (Deno colours them for a terminal).
    deno = subprocess.Popen(
        ["deno", "jupyter", "--kernel", "--conn", tcp_file],
        env=dict(os.environ, NO_COLOR="1"),
        preexec_fn=_die_with_parent,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, lambda: deno.send_signal(signal.SIGINT))
    loop.add_signal_handler(signal.SIGTERM, lambda: deno.send_signal(signal.SIGTERM))
    rc = await loop.run_in_executor(None, deno.wait)
    for s in servers:
        s.close()
    os.unlink(tcp_file)
    os._exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

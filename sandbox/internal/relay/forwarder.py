# The egress forwarder of Triad: it runs in the sandbox beside the kernel, with
# no privilege and no network. It listens at PROXY for the processes
# of the sandbox, and at the host endpoint given as its argument for Triad:
# "unix:PATH" (a socket in the directory the host bind-mounts) or
# "tcp:127.0.0.1:PORT" (a port the host reaches by port-forward). The host
# dials in and keeps a few connections idle; the forwarder writes R on
# each when it is ready, and pairs each process connection with an idle
# one, writing P on it first, then relays bytes both ways. With no host
# connection at all (a run without an egress policy) it answers at once
# with a refusal. A second argument, "HOST:PORT", moves PROXY (for tests). It is plumbing, not a boundary: the host decides.
# Written without single quotes: it is quoted for sh.
import collections, os, selectors, socket, sys

PROXY = ("127.0.0.1", PROXYPORT)
BUF = 1 << 18
REFUSAL = (b"HTTP/1.1 403 Triad egress denied: this run has no egress policy, so its sandbox reaches nothing\r\n"
           b"Content-Type: text/plain\r\nContent-Length: 67\r\nConnection: close\r\n\r\n"
           b"Triad egress denied: this run has no egress policy (nothing to do)\n")
R, W = selectors.EVENT_READ, selectors.EVENT_WRITE
sel = selectors.DefaultSelector()


def listen(spec):
    if spec.startswith("unix:"):
        path = spec[5:]
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
    else:
        host, port = spec[4:].rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
    s.listen(128)
    s.setblocking(False)
    return s


class End:
    __slots__ = ("sock", "peer", "out", "eof", "shut_after", "mask", "pair")

    def __init__(self, sock, pair):
        self.sock, self.pair = sock, pair
        self.peer, self.out, self.eof, self.shut_after, self.mask = None, None, False, False, 0


class Pair:
    __slots__ = ("ends", "closed")

    def __init__(self):
        self.ends, self.closed = [], False


idle = collections.deque()
waiting = collections.deque()
state = {"paired": 0}


def nodelay(s):
    # Relayed bytes go on at once: with Nagle, a TLS handshake relayed in
    # small writes waits on delayed acknowledgements (40 ms each).
    if s.family == socket.AF_INET:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def set_mask(e, mask):
    if mask == e.mask:
        return
    if e.mask == 0:
        sel.register(e.sock, mask, e)
    elif mask == 0:
        sel.unregister(e.sock)
    else:
        sel.modify(e.sock, mask, e)
    e.mask = mask


def update(e):
    m = 0
    if not e.eof and e.peer.out is None:
        m |= R
    if e.out is not None:
        m |= W
    set_mask(e, m)


def close_pair(p):
    if p.closed:
        return
    p.closed = True
    state["paired"] -= 1
    for e in p.ends:
        set_mask(e, 0)
        e.sock.close()
    starve()


def starve():
    # No host connection is left to come back: the clients waiting for
    # one are refused rather than kept waiting for nothing.
    if state["paired"] == 0 and not idle:
        while waiting:
            refuse(waiting.popleft())


def shut(e):
    try:
        e.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def done(e):
    if e.eof and e.peer.eof and e.out is None and e.peer.out is None:
        close_pair(e.pair)


def pair(client, host):
    try:
        host.send(b"P")
    except OSError:
        host.close()
        return False
    state["paired"] += 1
    p = Pair()
    a, b = End(client, p), End(host, p)
    a.peer, b.peer = b, a
    p.ends = [a, b]
    update(a)
    update(b)
    return True


def refuse(c):
    try:
        c.send(REFUSAL)
        c.shutdown(socket.SHUT_WR)
    except OSError:
        c.close()
        return
    sel.register(c, R, "drain")


def accept_hosts(hl):
    while True:
        try:
            h, _ = hl.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        h.setblocking(False)
        nodelay(h)
        try:
            h.send(b"R")
        except OSError:
            h.close()
            continue
        while waiting:
            if pair(waiting.popleft(), h):
                break
        else:
            idle.append(h)
            sel.register(h, R, "idle")


def accept_clients(cl, hl):
    while True:
        try:
            c, _ = cl.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        c.setblocking(False)
        nodelay(c)
        accept_hosts(hl)
        while idle:
            h = idle.popleft()
            sel.unregister(h)
            if pair(c, h):
                break
        else:
            if state["paired"] > 0 and len(waiting) < 256:
                waiting.append(c)
            else:
                refuse(c)


def readable(e):
    try:
        data = e.sock.recv(BUF)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        close_pair(e.pair)
        return
    if not data:
        e.eof = True
        if e.peer.out is None:
            shut(e.peer)
        else:
            e.peer.shut_after = True
    else:
        try:
            n = e.peer.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            close_pair(e.pair)
            return
        if n < len(data):
            e.peer.out = memoryview(data)[n:]
    update(e)
    update(e.peer)
    done(e)


def writable(e):
    try:
        n = e.sock.send(e.out)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        close_pair(e.pair)
        return
    e.out = e.out[n:] if n < len(e.out) else None
    if e.out is None and e.shut_after:
        shut(e)
    update(e)
    update(e.peer)
    done(e)


def main():
    hl = listen(sys.argv[1])
    cl = listen(("tcp:" + sys.argv[2]) if len(sys.argv) > 2 else ("tcp:%s:%d" % PROXY))
    sel.register(hl, R, "hosts")
    sel.register(cl, R, "clients")
    while True:
        for key, ev in sel.select():
            d = key.data
            if d == "hosts":
                accept_hosts(hl)
            elif d == "clients":
                accept_clients(cl, hl)
            elif d == "idle":
                # The host never writes on an idle connection: this is
                # its end (or garbage), and the connection goes.
                idle.remove(key.fileobj)
                sel.unregister(key.fileobj)
                key.fileobj.close()
                starve()
            elif d == "drain":
                try:
                    more = key.fileobj.recv(BUF)
                except OSError:
                    more = b""
                if not more:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            elif not d.pair.closed:
                if ev & W and d.out is not None:
                    writable(d)
                if ev & R and not d.pair.closed and d.mask & R:
                    readable(d)


main()

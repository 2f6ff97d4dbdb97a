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
# With a unix host endpoint it also listens at PATH.ports, where the host
# asks for a port of the sandbox (getHost): the host writes the port and a
# newline; the forwarder connects to it on the loopback of the sandbox and
# writes P, then relays bytes both ways, or writes E, why, and a newline.
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
    __slots__ = ("ends", "closed", "counted")

    def __init__(self, counted):
        self.ends, self.closed, self.counted = [], False, counted


class PortReq:
    __slots__ = ("sock", "buf")

    def __init__(self, sock):
        self.sock, self.buf = sock, b""


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
    if p.counted:
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


def pair(client, host, counted=True):
    try:
        host.send(b"P")
    except OSError:
        host.close()
        return False
    if counted:
        state["paired"] += 1
    p = Pair(counted)
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


def accept_ports(pl):
    while True:
        try:
            h, _ = pl.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        h.setblocking(False)
        sel.register(h, R, PortReq(h))


def dial_local(port):
    err = None
    for fam, addr in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port, 0, 0))):
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(addr)
            return s
        except OSError as e:
            s.close()
            err = e
    raise err


def port_request(q):
    try:
        data = q.sock.recv(16)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    q.buf += data
    if b"\n" not in q.buf:
        if data and len(q.buf) < 16:
            return
        sel.unregister(q.sock)
        q.sock.close()
        return
    sel.unregister(q.sock)
    try:
        port = int(q.buf.split(b"\n", 1)[0])
        if not 0 < port < 65536:
            raise ValueError("port %d is out of range" % port)
        c = dial_local(port)
    except (ValueError, OSError) as e:
        try:
            q.sock.setblocking(True)
            q.sock.settimeout(5)
            q.sock.sendall(b"E" + str(e).encode()[:200].replace(b"\n", b" ") + b"\n")
        except OSError:
            pass
        q.sock.close()
        return
    c.setblocking(False)
    nodelay(c)
    pair(c, q.sock, False)


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
    # The ports endpoint listens before PROXY does: once a process can
    # reach PROXY, the host can reach a port.
    pl = None
    if sys.argv[1].startswith("unix:"):
        pl = listen(sys.argv[1] + ".ports")
        sel.register(pl, R, "ports")
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
            elif d == "ports":
                accept_ports(pl)
            elif isinstance(d, PortReq):
                port_request(d)
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

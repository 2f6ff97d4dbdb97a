# Triad's file agent for a kernel pod (sandbox/kube). Triad ships this
# program over the stdin of a `pods/exec` session into the pod's agent
# container (python3 -c BOOTSTRAP reads it first), so every replica speaks
# its own version of it to every pod, and the image does not change when
# it does.
#
# Protocol, on stdin and stdout: frames, each a 4-byte big-endian length and
# that many bytes. A request is one JSON frame {"op": ...}; put then sends
# data frames, an empty frame and {"commit": BOOL} (false when Triad could
# not read what it was putting, so nothing half-written replaces the file).
# A reply is one JSON frame
# {"ok": true, ...} or {"ok": false, "err": KIND, "msg": TEXT}, where KIND is
# notexist, notregular or io; open's header is followed by data frames, an
# empty frame and a trailer frame, scan's by list frames and {"end": true}.
#
# Every path is walked from a descriptor of /work one component at a time
# with O_NOFOLLOW, so a symlink a cell planted is never followed, and a
# FIFO is opened with O_NONBLOCK and refused. Triad validates every path
# before sending it and trusts nothing this program says about sizes or
# contents: it hashes what it receives.
import errno
import json
import os
import socket
import stat
import struct
import sys
import time

ROOT = "/home/user"  # image.Work (sandbox/image); /work is a symlink to it
CONN = "/run/kernel/conn.json"
TMP_PREFIX = ".triad-put-"
MAX_FRAME = 1 << 20
CHUNK = 256 << 10
LIST_BATCH = 2000

inp = sys.stdin.buffer
out = sys.stdout.buffer


class Refused(Exception):
    def __init__(self, kind, msg):
        Exception.__init__(self, msg)
        self.kind = kind


def readn(n):
    b = inp.read(n)
    if b is None or len(b) != n:
        raise EOFError("triad hung up")
    return b


def recv():
    (n,) = struct.unpack(">I", readn(4))
    if n > MAX_FRAME:
        raise ValueError("frame of %d bytes" % n)
    return readn(n) if n else b""


def send(b):
    out.write(struct.pack(">I", len(b)))
    if b:
        out.write(b)


def reply(obj):
    send(json.dumps(obj, separators=(",", ":")).encode())
    out.flush()


def fail(e):
    if isinstance(e, Refused):
        return {"ok": False, "err": e.kind, "msg": str(e)}
    if isinstance(e, FileNotFoundError):
        return {"ok": False, "err": "notexist", "msg": str(e)}
    if isinstance(e, OSError) and e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
        return {"ok": False, "err": "notregular", "msg": str(e)}
    return {"ok": False, "err": "io", "msg": "%s: %s" % (type(e).__name__, e)}


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def parent(path, create):
    """Returns a descriptor of path's directory and path's last name.
    With create, missing directories are made and anything else in the way
    of one (a file, a symlink) is removed first."""
    parts = path.split("/")
    fd = os.open(ROOT, DIR_FLAGS)
    try:
        for p in parts[:-1]:
            try:
                nfd = os.open(p, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(p, 0o755, dir_fd=fd)
                nfd = os.open(p, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not create:
                    raise Refused("notregular", "%s is not a directory" % p)
                os.unlink(p, dir_fd=fd)
                os.mkdir(p, 0o755, dir_fd=fd)
                nfd = os.open(p, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def stamp(st):
    return [st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def drain():
    """Reads the rest of a put: data frames, the empty frame, the commit."""
    while recv():
        pass
    recv()


def op_put(req):
    try:
        fd, name = parent(req["path"], True)
    except Exception as e:
        drain()
        return fail(e)
    tmp = "%s%s.tmp" % (TMP_PREFIX, os.urandom(8).hex())
    try:
        try:
            # O_EXCL never follows a symlink, so a cell cannot aim the
            # temporary file elsewhere.
            w = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644, dir_fd=fd)
        except Exception as e:
            drain()
            return fail(e)
        err = None
        try:
            while True:
                b = recv()
                if not b:
                    break
                if err is None:
                    try:
                        v = memoryview(b)
                        while v:
                            v = v[os.write(w, v):]
                    except Exception as e:
                        err = e
            commit = json.loads(recv()).get("commit")
            if err is not None:
                raise err
            if not commit:
                raise Refused("io", "triad abandoned the put")
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    raise Refused("notregular", "a directory is in the way")
            except FileNotFoundError:
                pass
            # rename(2) replaces a symlink at name rather than following it.
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            tmp = None
            # The descriptor still names the file just renamed, so its
            # stamp is this file's even if a cell replaces the path now.
            return {"ok": True, "stamp": stamp(os.fstat(w))}
        except Exception as e:
            return fail(e)
        finally:
            os.close(w)
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)


def op_remove(req):
    try:
        fd, name = parent(req["path"], False)
    except FileNotFoundError:
        return {"ok": True}
    except Exception as e:
        return fail(e)
    try:
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            os.rmdir(name, dir_fd=fd)
        except PermissionError:
            if not stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                raise
            os.rmdir(name, dir_fd=fd)
        return {"ok": True}
    except Exception as e:
        return fail(e)
    finally:
        os.close(fd)


def op_scan(req):
    files, skipped = [], []

    def flush(force):
        if force or len(files) + len(skipped) >= LIST_BATCH:
            send(json.dumps({"files": files, "skipped": skipped}, separators=(",", ":")).encode())
            del files[:]
            del skipped[:]

    def walk(fd, prefix):
        try:
            entries = list(os.scandir(fd))
        except OSError:
            skipped.append(prefix.rstrip("/"))
            return
        for e in entries:
            try:
                e.name.encode("utf-8")
            except UnicodeEncodeError:
                skipped.append(prefix + e.name.encode("utf-8", "backslashreplace").decode())
                continue
            p = prefix + e.name
            try:
                st = os.lstat(e.name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError:
                skipped.append(p)
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(e.name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    skipped.append(p)
                    continue
                try:
                    walk(sub, p + "/")
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                if not e.name.startswith(TMP_PREFIX):
                    files.append([p] + stamp(st))
            else:
                skipped.append(p)
            flush(False)

    try:
        root = os.open(ROOT, DIR_FLAGS)
    except Exception as e:
        return fail(e)
    try:
        reply({"ok": True})
        walk(root, "")
        flush(True)
        return {"end": True}
    finally:
        os.close(root)


def op_open(req):
    try:
        fd, name = parent(req["path"], False)
    except Exception as e:
        return fail(e)
    try:
        try:
            # O_NONBLOCK: a FIFO must not block the open; it is refused below.
            r = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except Exception as e:
            return fail(e)
    finally:
        os.close(fd)
    try:
        st = os.fstat(r)
        if not stat.S_ISREG(st.st_mode):
            return {"ok": False, "err": "notregular", "msg": "not a regular file"}
        reply({"ok": True, "stamp": stamp(st)})
        left, err = st.st_size, None
        while left > 0:
            try:
                b = os.read(r, min(CHUNK, left))
            except OSError as e:
                err = e
                break
            if not b:
                break
            send(b)
            left -= len(b)
        send(b"")
        if err is not None:
            return fail(err)
        return {"ok": True, "short": left}
    finally:
        os.close(r)


def op_conn(req):
    """Waits until the kernel wrote its connection file and listens on the
    four ports Triad dials (ipykernel binds them one after the other, the
    heartbeat last), then returns the file."""
    deadline = time.monotonic() + float(req.get("wait", 60))
    last = "no connection file yet"
    while True:
        try:
            with open(CONN, "rb") as f:
                data = f.read(1 << 16)
            info = json.loads(data)
            for port in ("shell_port", "iopub_port", "control_port", "hb_port"):
                s = socket.create_connection(("127.0.0.1", int(info[port])), timeout=1)
                s.close()
            return {"ok": True, "conn": data.decode()}
        except Exception as e:
            last = "%s: %s" % (type(e).__name__, e)
        if time.monotonic() > deadline:
            return {"ok": False, "err": "io", "msg": "the kernel is not listening: " + last}
        time.sleep(0.02)


def op_kill(req):
    """SIGKILLs every process of this uid outside the agent's container (the
    pod shares one process namespace): the kernel and its children. A
    process is the agent container's when its root directory is the
    agent's (the device and inode of /proc/PID/root: each container has a
    root filesystem of its own, and no process here can change its root);
    where that cannot be read, its cgroup. PID 1 is the pod's pause
    process, never touched: under gVisor it runs as the pod's uid, and
    killing it ends the whole pod, the agent's container with it. Under
    gVisor neither cgroups, namespace inodes (a fake one per process) nor
    mountinfo (one view for all) tell containers apart; roots do."""
    def ident(pid):
        try:
            st = os.stat("/proc/%s/root/" % pid)
            return "root:%d:%d" % (st.st_dev, st.st_ino)
        except OSError:
            with open("/proc/%s/cgroup" % pid) as f:
                return "cgroup:" + f.read()

    mine, uid, n, me = ident("self"), os.getuid(), 0, os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in (1, me):
            continue
        try:
            if os.stat("/proc/" + pid).st_uid != uid or ident(pid) == mine:
                continue
            os.kill(int(pid), 9)
            n += 1
        except OSError:
            pass
    return {"ok": True, "killed": n}


OPS = {"put": op_put, "remove": op_remove, "scan": op_scan, "open": op_open, "conn": op_conn, "kill": op_kill}


def main():
    reply({"ok": True, "agent": 1, "uid": os.getuid(), "pid": os.getpid()})
    while True:
        try:
            req = json.loads(recv())
        except EOFError:
            return
        fn = OPS.get(req.get("op"))
        if fn is None:
            reply({"ok": False, "err": "io", "msg": "unknown op %r" % req.get("op")})
            continue
        reply(fn(req))


main()

# The cost of single system calls and wakeups in this container: run it under
# each runtime (bench/gvisor/probe/run.sh) to compare what gVisor adds per call.
import os, time, socket, threading
def t(f, n):
    s=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-s)/n*1e6
r,w=os.pipe()
def pp():
    os.write(w,b'x'); os.read(r,1)
a,b=socket.socketpair()
def sp():
    a.send(b'x'); b.recv(1)
res={'getppid_us':t(os.getppid,100000),'pipe_rw_us':t(pp,50000),'sockpair_rw_us':t(sp,50000),'stat_us':t(lambda: os.stat('/home'),50000)}
# thread ping-pong via futex-ish condition
import queue
q1,q2=queue.Queue(),queue.Queue()
def echo():
    while True:
        v=q1.get()
        if v is None: return
        q2.put(v)
th=threading.Thread(target=echo); th.start()
def pq(): q1.put(1); q2.get()
res['thread_pingpong_us']=t(pq,20000)
q1.put(None); th.join()
print(res)

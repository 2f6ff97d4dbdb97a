# Runs `1+1` cells in an ipykernel through jupyter_client, both inside the
# container, and prints the time per cell; the host attaches strace to the
# kernel (under runc) to count its system calls per cell (bench/gvisor/probe/run.sh).
import time, sys
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name='python3')
for _ in range(5): kc.execute_interactive('1+1', output_hook=lambda m: None)
open('/tmp/ready','w').write('1'); print('READY', flush=True)
time.sleep(8)  # host attaches strace
t=time.perf_counter()
for _ in range(50): kc.execute_interactive('1+1', output_hook=lambda m: None)
print('per cell ms', (time.perf_counter()-t)/50*1000, flush=True)
time.sleep(2)
km.shutdown_kernel(now=True)

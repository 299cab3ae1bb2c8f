"""A worker for file_timer_test.py: torch's own watchdog client, unchanged.

Attempt 0: rank 1 hangs inside ``expires(after=2, scope="hung step")`` (the
watchdog must kill it); rank 0 waits to be stopped.
Attempt 1: rank 0 sends the agent a line that is not a request and a timer,
already expired, with SIGKILL for a process that is not a worker (its own
child): both must be refused, the child left alone (rank 0 looks once the
test has seen the agent log its refusal: $FILE_TIMER_TEST_REFUSED exists). Both ranks then run a
step inside a timer that they release in time, and exit 0.
"""

import os
import signal
import subprocess
import sys
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires
from torch.distributed.elastic.timer.file_based_local_timer import FileTimerRequest

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
path = os.environ["TORCHELASTIC_TIMER_FILE"]
print(f"rank {rank} attempt {attempt} timer file {path}", flush=True)
configure(FileTimerClient(path))

if attempt == 0:
    if rank == 1:
        with expires(after=2, scope="hung step"):
            time.sleep(120)
        sys.exit("rank 1: the watchdog never came")
    time.sleep(120)
    sys.exit("rank 0: never stopped")

if rank == 0:
    child = subprocess.Popen(["sleep", "120"])
    with open(path, "w") as fifo:
        fifo.write("this is not a request\n")
        forged = FileTimerRequest(child.pid, "forged", time.time() - 1, signal.SIGKILL)
        fifo.write(forged.to_json() + "\n")
    # The test says when the agent has logged its refusal of the forged
    # timer (which it acts on, or not, as it reads the request).
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["FILE_TIMER_TEST_REFUSED"]):
        if time.monotonic() > deadline:
            sys.exit("rank 0: the agent never refused the forged timer")
        time.sleep(0.05)
    alive = child.poll() is None
    child.kill()
    child.wait()
    if not alive:
        sys.exit("rank 0: the agent killed a process that is not its worker")
    print("rank 0: the forged timer's process survived", flush=True)

with expires(after=60, scope="quick step"):
    time.sleep(0.2)
print(f"rank {rank}: done", flush=True)

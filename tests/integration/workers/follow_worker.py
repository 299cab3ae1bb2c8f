# Worker for endpoint_list_test: does store traffic through its agent's relay
# (torch's TCPStore client on MASTER_ADDR:MASTER_PORT) and through the C++
# gRPC store client given MESHRUN_STORE_ENDPOINT (a list of daemon replicas),
# across the daemon's switch to another replica.
#   follow_worker.py GO LIMIT STORE_TOOL
# Prints "WORKER rank=R pid=P restart=C", "STORED rank=R" once its key is
# written, reads its key until the test creates GO (at most LIMIT s), then
# meets every rank at a barrier and reads every rank's key both ways.
import datetime
import os
import subprocess
import sys
import time

go, limit, store_tool_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(
    f"WORKER rank={rank} pid={os.getpid()} restart={os.environ['TORCHELASTIC_RESTART_COUNT']}",
    flush=True,
)
from torch.distributed import TCPStore  # noqa: E402  (after the start line: slow)

store = TCPStore(
    os.environ["MASTER_ADDR"],
    int(os.environ["MASTER_PORT"]),
    is_master=False,
    timeout=datetime.timedelta(seconds=60),
)
endpoint, prefix = os.environ["MESHRUN_STORE_ENDPOINT"], os.environ["MESHRUN_STORE_PREFIX"]


def store_tool(*args: str) -> str:
    done = subprocess.run(
        [store_tool_path, endpoint, prefix, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


store.set(f"before{rank}", f"value{rank}")
store_tool("set", f"grpc{rank}", f"value{rank}")
print(f"STORED rank={rank}", flush=True)
deadline = time.monotonic() + limit
reads = 0
while not os.path.exists(go):
    if time.monotonic() > deadline:
        print(f"WORKER rank={rank} gave up waiting for {go}", flush=True)
        sys.exit(3)
    # Reads, which the relay sends again after a reconnect.
    assert store.get(f"before{rank}") == f"value{rank}".encode()
    reads += 1
    time.sleep(0.05)
store.set(f"after{rank}", "1")
store.wait([f"after{r}" for r in range(world)])
seen = [store.get(f"before{r}").decode() for r in range(world)]
assert seen == [f"value{r}" for r in range(world)], seen
# The gRPC client's keys are its own (the relay's TCPStore view is another).
got = store_tool("get", f"grpc{(rank + 1) % world}", "20000")
assert f"value=value{(rank + 1) % world}" in got.split(), got
print(f"WORKER rank={rank} done reads={reads}", flush=True)

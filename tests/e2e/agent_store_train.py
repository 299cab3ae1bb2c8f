"""A DDP job written for torchrun (env://, gloo, nothing meshrun-specific),
instrumented for AgentStoreTest by the files it writes.

    agent_store_train.py OUT_DIR TAG [--steps N] [--stall-rank R]

Trains a small MLP for N steps. Then, through a TCPStore client of its own
at MASTER_ADDR:MASTER_PORT (as any script may open beside torch's), sets
trained/<restart>/<rank> = "1", and writes OUT_DIR/TAG.<rank>.a<restart>.env:
its environment, one KEY=VALUE a line, plus _PID and _LISTEN (the TCP ports
this process listens on, comma-separated, from /proc/self).

--stall-rank R: on the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank R
writes its pid to OUT_DIR/TAG.stalled.pid after a few steps, and every rank
keeps training until something ends the job (bounded: exit 3 after 120 s).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def listening_ports():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                # st 0A is LISTEN; field 9 the socket's inode.
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def write_file(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("tag")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--stall-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)

    def step():
        x = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()

    if args.stall_rank >= 0 and restart == 0:
        deadline = time.monotonic() + 120
        for n in range(1_000_000):
            step()
            if n == 3 and rank == args.stall_rank:
                write_file(
                    os.path.join(args.out_dir, f"{args.tag}.stalled.pid"), f"{os.getpid()}\n"
                )
            if time.monotonic() > deadline:
                raise SystemExit(3)
            time.sleep(0.05)

    for _ in range(args.steps):
        step()

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    store.set(f"trained/{restart}/{rank}", "1")
    env = dict(os.environ)
    env["_PID"] = str(os.getpid())
    env["_LISTEN"] = ",".join(str(p) for p in listening_ports())
    write_file(
        os.path.join(args.out_dir, f"{args.tag}.{rank}.a{restart}.env"),
        "".join(k + "=" + env[k].replace("\n", "\\n") + "\n" for k in sorted(env)),
    )
    del store
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # No interpreter finalization: torch 2.15's Gloo threads may still drop a
    # finished work's tensors then, which aborts the process ("terminate
    # called without an active exception"; see examples/ddp_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""A torchrun-style DDP worker (env://, gloo; world 2) that lives through a
restart of the rendezvous daemon behind its agent's store relay
(RelayRestartTest).

    relay_restart_worker.py OUT_DIR

Trains a few DDP steps, opens a stock torch TCPStore client at
MASTER_ADDR:MASTER_PORT, and then, steered by files in OUT_DIR:
  rank 0 writes "waiting" (its pid) and blocks in store.wait(["released"]),
         which the test sees parked at the daemon before it stops it;
  rank 1 writes "ready.1", waits for "release" (the test writes it once the
         daemon is back) and sets "released".
After that, both: dist.barrier(), dist.new_group() and a barrier on it, a
store barrier on the default store (torchrun's own), and DDP training on the
new group with an all_reduce checked; then each writes "done.<rank>" (rank 0
also "released.0": the value it got). Any failure: an exception, exit 1.
Every wait is bounded (DEADLINE_S).
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from handshake_files import DEADLINE_S, await_file, write_file
from torch.distributed.elastic.utils import store as elastic_store
from torch.nn.parallel import DistributedDataParallel as DDP

TIMEOUT = datetime.timedelta(seconds=DEADLINE_S)


def train(rank, group=None, steps=5):
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)),
        process_group=group,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        opt.step()


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, world
    train(rank)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=TIMEOUT
    )
    if rank == 0:
        write_file(os.path.join(out_dir, "waiting"), f"{os.getpid()}\n")
        store.wait(["released"])  # through the daemon's restart
        write_file(os.path.join(out_dir, "released.0"), store.get("released").decode())
    else:
        write_file(os.path.join(out_dir, "ready.1"), f"{os.getpid()}\n")
        await_file(os.path.join(out_dir, "release"))
        store.set("released", "after-the-restart")

    dist.barrier()
    group = dist.new_group(list(range(world)))
    dist.barrier(group=group)
    elastic_store.barrier(
        dist.distributed_c10d._get_default_store(),
        world,
        key_prefix="relay-restart/store-barrier",
        barrier_timeout=DEADLINE_S,
    )
    train(rank, group)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total, group=group)
    assert total.item() == world * (world + 1) / 2, total
    write_file(os.path.join(out_dir, f"done.{rank}"), "ok\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # No interpreter finalization: torch 2.15's Gloo threads may still drop a
    # finished work's tensors then (see agent_store_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

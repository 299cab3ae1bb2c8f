"""A worker for hang_test.py, launched by meshrun or torchrun 2.

ddp (the default): a DDP training loop over Gloo that prints every step. On
the first attempt, the last rank stops itself (SIGSTOP) at step HANG_AT:
every other rank then waits in the gradient all-reduce. A restarted attempt
trains to the end.

spin: one rank that calls meshrun.heartbeat() every step and, on the first
attempt, then spins at a full core without it; a child it forks sends a
heartbeat the agent must refuse (not a worker).

flood: a child it forks floods the agent's heartbeat socket as fast as it
can (refused: not a worker) while the worker heartbeats every 50 ms for
FLOOD_S seconds and exits; the child floods on until the agent, noticing the
exit, ends the worker's process group.

steps: every rank heartbeats STEPS steps with its step time; the last rank
says its steps take three times as long as the others'.
"""

import os
import signal
import sys
import time

RANK = int(os.environ["RANK"])
WORLD_SIZE = int(os.environ["WORLD_SIZE"])
RESTART = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
HANG_AT = 20
STEPS = 40
FLOOD_S = 4


def hold() -> None:
    print(f"rank {RANK}: stopping myself at step {HANG_AT}", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def ddp() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if RESTART == 0 and step == HANG_AT and RANK == WORLD_SIZE - 1:
            hold()
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {RANK}: step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    print(f"rank {RANK}: done (restart {RESTART})", flush=True)


def spin() -> None:
    import meshrun

    for _ in range(10):
        assert meshrun.heartbeat(), "no MESHRUN_HEARTBEAT_SOCKET"
        time.sleep(0.05)
    child = os.fork()
    if child == 0:
        meshrun.heartbeat()
        os._exit(0)
    os.waitpid(child, 0)
    print(f"rank {RANK}: a child (pid {child}) sent a heartbeat", flush=True)
    if RESTART == 0:
        print(f"rank {RANK}: spinning without heartbeats", flush=True)
        while True:
            pass
    print(f"rank {RANK}: done (restart {RESTART})", flush=True)


def flood() -> None:
    import socket

    import meshrun

    name = os.environ["MESHRUN_HEARTBEAT_SOCKET"]
    if os.fork() == 0:
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        address = "\0" + name[1:]
        while True:  # until the agent ends the worker's process group
            try:
                sender.sendto(b"1", address)
            except OSError:
                pass
    arrived = 0
    end = time.monotonic() + FLOOD_S
    while time.monotonic() < end:
        # False where the socket's queue was full: the next one may pass.
        arrived += meshrun.heartbeat()
        time.sleep(0.05)
    print(f"rank {RANK}: {arrived} heartbeats queued through a flood", flush=True)
    print(f"rank {RANK}: done (restart {RESTART})", flush=True)


def steps() -> None:
    import meshrun

    seconds = 0.03 if RANK == WORLD_SIZE - 1 else 0.01
    for _ in range(STEPS * 3):
        time.sleep(0.05)
        assert meshrun.heartbeat(step_seconds=seconds), "no MESHRUN_HEARTBEAT_SOCKET"
    print(f"rank {RANK}: done", flush=True)


if __name__ == "__main__":
    {"ddp": ddp, "spin": spin, "flood": flood, "steps": steps}[
        sys.argv[1] if len(sys.argv) > 1 else "ddp"
    ]()

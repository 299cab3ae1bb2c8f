"""meshrun.ft's replica dimension on a GPU (issue 44 item 2), for
scripts/device-check.sh: what needs CUDA, without meshrun's daemon (the
device machine builds the worker library alone).

  heal     a replica group whose model is on cuda:0 healed over Gloo from a
           CPU peer (two participants, threads, Manager's own heal), and a
           CUDA gradient averaged over that Gloo dimension;
  abort    a 2-rank NCCL replica group whose peer never comes, under the
           agent's TORCH_NCCL_ASYNC_ERROR_HANDLING=1: forming it fails within
           the timeout, the process lives on (past the watchdog's timeout
           too), and a fresh group then works;
  peer     (two GPUs or more) a peer that dies between two all-reduces: the
           survivor's all-reduce raises within the timeout instead of hanging
           or being torn down, and a fresh group of one then works.

Each prints PASS/FAIL/SKIP lines; exit 0 when none failed. --dry (or no
CUDA) runs the heal on CPU and skips the NCCL parts: what this machine checks.

Usage: PYTHONPATH=python ft_nccl_check.py [--dry] [heal|abort|peer ...]
"""

import datetime
import os
import subprocess
import sys
import threading
import time
import types
from unittest import mock

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=10)
failed = False


def say(status: str, what: str) -> None:
    global failed
    failed |= status == "FAIL"
    print(f"{status} ft {what}", flush=True)


def import_ft():
    """meshrun.ft, with stand-ins for the daemon's gRPC client where the
    machine has no grpcio or no generated stubs (the heal never calls it)."""
    try:
        from meshrun import ft
    except ImportError:
        for name in ("grpc", "meshrun.v1", "meshrun.v1.rendezvous_pb2",
                     "meshrun.v1.rendezvous_pb2_grpc"):  # fmt: skip
            sys.modules.setdefault(name, mock.MagicMock())
        from meshrun import ft
    return ft


def identity(replica: int, replicas: int = 2) -> types.SimpleNamespace:
    return types.SimpleNamespace(replica=replica, member=0, incarnation=0,
                                 replicas_in_world=replicas)  # fmt: skip


def check_heal(device: torch.device) -> None:
    ft = import_ft()
    from meshrun._daemon import Quorum
    from meshrun._replica_group import ReplicaDimension

    store = dist.HashStore()
    groups: list = [None, None]

    def make(r: int) -> None:
        groups[r] = dist.ProcessGroupGloo(store, r, 2, TIMEOUT)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    torch.manual_seed(0)
    source_model = torch.nn.Linear(256, 256)  # the CPU peer
    receiver_model = torch.nn.Linear(256, 256).to(device)
    managers = []
    for r, model in ((0, source_model), (1, receiver_model)):
        dim = ReplicaDimension(identity(r), store, "gloo", TIMEOUT)
        dim.group, dim.group_id = groups[r], 1
        m = object.__new__(ft.Manager)
        m._id, m._replicas, m._discard_reason = dim._id, dim, ""
        m._step = 9 if r == 0 else 0
        m._history = [[0, 1]] * m._step
        m._state_dict = model.state_dict
        m._load_state_dict = model.load_state_dict
        managers.append(m)
    quorum = Quorum(1, [0, 1], 9, 0, True, 1)
    errors = []

    def heal(m) -> None:
        try:
            m._heal(quorum, 0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=heal, args=(m,)) for m in managers]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    same = all(
        torch.equal(a.cpu(), b.cpu())
        for a, b in zip(source_model.parameters(), receiver_model.parameters(), strict=True)
    )
    where = next(receiver_model.parameters()).device
    if errors or not same or managers[1]._step != 9 or where.type != device.type:
        say("FAIL", f"heal over gloo to {device}: errors {errors}, equal {same}, on {where}")
    else:
        say("PASS", f"heal over gloo from a CPU peer to a replica group on {where}: step 9")
    # A CUDA gradient averaged over the Gloo replica dimension.
    grads = [torch.full((4,), float(r + 1), device=device) for r in range(2)]
    threads = [threading.Thread(target=managers[r]._replicas.allreduce, args=(grads[r],))
               for r in range(2)]  # fmt: skip
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    if all(torch.equal(g.cpu(), torch.full((4,), 3.0)) for g in grads):
        say("PASS", f"all-reduce of {device} tensors over the gloo replica dimension")
    else:
        say("FAIL", f"all-reduce over gloo: {[g.tolist() for g in grads]}")


def abort_child() -> None:
    """In its own process: a 2-rank NCCL group whose peer never comes."""
    from meshrun._replica_group import ReplicaDimension

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT)
    dim = ReplicaDimension(identity(0), store, "nccl", TIMEOUT)
    start = time.monotonic()
    try:
        dim.form(1, 0, 2)
        print("RESULT formed without its peer", flush=True)
        return
    except Exception as e:
        took = time.monotonic() - start
        print(f"RESULT raised after {took:.1f} s: {type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)  # fmt: skip
    dim.fail()
    time.sleep(TIMEOUT.total_seconds() + 5)  # past the watchdog's timeout: still here
    dim.form(2, 0, 1)  # a fresh communicator
    t = torch.ones(3, device=dim.device)
    dim.allreduce(t)
    print(f"RESULT fresh group ok {t.tolist()}", flush=True)


def peer_child(rank: int, port: int) -> None:
    from meshrun._replica_group import ReplicaDimension

    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dim = ReplicaDimension(identity(rank), store, "nccl", TIMEOUT)
    dim.form(1, rank, 2)
    t = torch.ones(3, device=dim.device)
    dim.allreduce(t)
    print(f"RESULT rank {rank} first all-reduce {t.tolist()}", flush=True)
    if rank == 1:
        os._exit(0)  # gone between two steps
    time.sleep(2)
    start = time.monotonic()
    try:
        dim.allreduce(t)
        print("RESULT rank 0 second all-reduce returned without its peer", flush=True)
        return
    except Exception as e:
        print(f"RESULT rank 0 raised after {time.monotonic() - start:.1f} s: "
              f"{type(e).__name__}", flush=True)  # fmt: skip
    dim.fail()
    dim.form(2, 0, 1)
    dim.allreduce(t)
    print(f"RESULT rank 0 fresh group ok {t.tolist()}", flush=True)


def child(args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    lines = (done.stdout + done.stderr).splitlines()
    return done.returncode, [line for line in lines if line.startswith("RESULT")] or lines[-5:]


def check_abort() -> None:
    env = dict(os.environ, TORCH_NCCL_ASYNC_ERROR_HANDLING="1")  # the agent's
    rc, lines = child(["--child-abort"], env)
    raised = any("raised after" in line for line in lines)
    fresh = any("fresh group ok [1.0, 1.0, 1.0]" in line for line in lines)
    say("PASS" if rc == 0 and raised and fresh else "FAIL",
                            f"nccl abort on one GPU (exit {rc}): {' | '.join(lines)}")  # fmt: skip


def check_peer() -> None:
    if torch.cuda.device_count() < 2:
        say(
            "SKIP",
            f"nccl peer death: {torch.cuda.device_count()} GPU (NCCL puts one rank on a GPU)",
        )
        return
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    env = dict(os.environ, TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    port = str(store.port)
    procs = [subprocess.Popen([sys.executable, __file__, "--child-peer", str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=120)[0] for p in procs]
    lines = [line for out in outs for line in out.splitlines() if line.startswith("RESULT")]
    ok = (procs[0].returncode == 0 and any("rank 0 raised after" in line for line in lines)
          and any("rank 0 fresh group ok" in line for line in lines))  # fmt: skip
    say("PASS" if ok else "FAIL", f"nccl peer death (exit {procs[0].returncode}): "
        f"{' | '.join(lines) or outs[0][-800:]}")  # fmt: skip


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--child-abort"]:
        abort_child()
        return
    if argv[:1] == ["--child-peer"]:
        peer_child(int(argv[1]), int(argv[2]))
        return
    dry = "--dry" in argv or not torch.cuda.is_available()
    parts = [a for a in argv if not a.startswith("--")] or ["heal", "abort", "peer"]
    if "heal" in parts:
        check_heal(torch.device("cpu") if dry else torch.device("cuda", 0))
    for name, check in (("abort", check_abort), ("peer", check_peer)):
        if name not in parts:
            continue
        if dry:
            say("SKIP", f"{name}: no CUDA here (--dry)")
        else:
            check()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

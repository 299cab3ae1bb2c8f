"""Peak memory of a heal (issue 44 item 3): meshrun.ft's against torchft's.

Three processes a heal, each holding a model's state of --mb MiB (float32
tensors of 64 MiB): the source (step 9), a healthy bystander (step 9) and a
receiver (step 0, zeros), on CPU, OMP_NUM_THREADS=1. Each process resets its
peak RSS (/proc/self/clear_refs 5) once its state is built and reports VmHWM
when the heal is done, with its RSS before the heal; the receiver checks
that it holds the source's values.

  meshrun       meshrun.ft's heal (this checkout's python/meshrun): the three
                processes form the replica dimension as a step's quorum does
                (Gloo reconfigure over a TCPStore) and run Manager._heal, the
                code a quorum with heal=True runs.
  meshrun-main  the same with `--main-tree DIR`'s python/meshrun (the heal
                before issue 44: the pickled state broadcast to everyone).
  torchft       torchft 0.2.0's heal: its Manager's default checkpoint
                transport (HTTPTransport, num_chunks=0): send_checkpoint of
                {"user": {...}, "torchft": {...}} on the source,
                recv_checkpoint and the user's load_state_dict on the
                receiver; its bystanders take no part. (The Manager's quorum
                and Lighthouse around it move no state.)

Prints one line per process and run, then per system and role the medians
over --rounds, and meshrun's peak above the state against torchft's.
Not in ctest (gigabytes, tens of seconds).

Usage: PYTHONPATH=python:build/python heal_memory.py [--mb 1024] [--rounds 3]
         [--systems meshrun,torchft] [--main-tree DIR]
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import types

ROLES = ("source", "bystander", "receiver")
TENSOR_MB = 64
TIMEOUT = datetime.timedelta(seconds=600)


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def make_state(mb: int, fill: bool):
    import torch

    state = {}
    n = TENSOR_MB * (1 << 20) // 4
    g = torch.Generator().manual_seed(0)
    for i in range(max(1, mb // TENSOR_MB)):
        state[f"layer{i}.weight"] = torch.rand(n, generator=g) if fill else torch.zeros(n)
    return state


def load_into(model: dict, received: dict) -> None:
    for key, tensor in model.items():
        tensor.copy_(received[key])


def checksum(state: dict) -> float:
    return float(sum(t.double().sum().item() for t in state.values()))


def child_meshrun(role: str, port: int, mb: int, tree: str) -> dict:
    sys.path.insert(0, tree)
    import torch
    import torch.distributed as dist
    from meshrun import ft
    from meshrun._daemon import Quorum
    from meshrun._replica_group import ReplicaDimension

    rank = ROLES.index(role)
    model = make_state(mb, fill=role != "receiver")
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    identity = types.SimpleNamespace(replica=rank, member=0, incarnation=0, replicas_in_world=3)
    dim = ReplicaDimension(identity, store, "gloo", TIMEOUT)
    dim.form(1, rank, 3)
    m = object.__new__(ft.Manager)
    m._id, m._replicas, m._discard_reason = identity, dim, ""
    m._device = torch.device("cpu")  # the heal before issue 44 reads it
    m._step = 0 if role == "receiver" else 9
    m._history = [[0, 1, 2]] * m._step
    m._state_dict = lambda: {"model": model}
    m._load_state_dict = lambda state: load_into(model, state["model"])
    store.set(f"ready{rank}", "1")
    store.wait([f"ready{r}" for r in range(3)])
    before = measure_start()
    start = time.monotonic()
    m._heal(Quorum(1, [0, 1, 2], 9, 0, True, 1), 0)
    took = time.monotonic() - start
    if m._discard_reason:
        raise RuntimeError(m._discard_reason)
    return finish(role, before, took, model, m._step)


def child_torchft(role: str, port: int, mb: int) -> dict:
    import torch.distributed as dist
    from torchft.checkpointing.http_transport import HTTPTransport

    model = make_state(mb, fill=role != "receiver")
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    transport = HTTPTransport(timeout=TIMEOUT, num_chunks=0)  # the Manager's default
    store.set(f"ready{ROLES.index(role)}", "1")
    store.wait([f"ready{r}" for r in range(3)])
    before = measure_start()
    start = time.monotonic()
    step = 0 if role == "receiver" else 9
    if role == "source":
        state = {"user": {"default": {"model": model}}, "torchft": {"step": 9, "batches": 9}}
        transport.send_checkpoint(dst_ranks=[2], step=9, state_dict=state, timeout=TIMEOUT)
        address = transport.metadata().replace(f"//{os.uname().nodename}:", "//127.0.0.1:")
        store.set("address", address)
        store.wait(["received"])
    elif role == "receiver":
        store.wait(["address"])
        received = transport.recv_checkpoint(
            src_rank=0, metadata=store.get("address").decode(), step=9, timeout=TIMEOUT
        )
        load_into(model, received["user"]["default"]["model"])
        step = received["torchft"]["step"]
        del received
        store.set("received", "1")
    else:
        store.wait(["received"])
    took = time.monotonic() - start
    transport.shutdown(wait=False)
    return finish(role, before, took, model, step)


def measure_start() -> int:
    """RSS now; the peak from here on (clear_refs 5 resets VmHWM)."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kb("VmRSS")


def finish(role: str, before_kb: int, took: float, model: dict, step: int) -> dict:
    peak = status_kb("VmHWM")
    return {
        "role": role,
        "rss_before_mb": before_kb / 1024,
        "peak_mb": peak / 1024,
        "above_mb": (peak - before_kb) / 1024,
        "seconds": took,
        "step": step,
        "checksum": checksum(model),
    }


def run_once(system: str, mb: int, main_tree: str, here: str) -> list[dict]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                system,
                role,
                str(store.port),
                str(mb),
                main_tree if system == "meshrun-main" else here,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for role in ROLES
    ]
    results = []
    for role, p in zip(ROLES, procs, strict=True):
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"{system} {role} exit {p.returncode}: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    source, receiver = results[0], results[2]
    if receiver["step"] != 9 or abs(receiver["checksum"] - source["checksum"]) > 1e-6 * abs(
        source["checksum"]
    ):
        raise RuntimeError(f"{system}: the receiver does not hold the source's state: {results}")
    return results


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        system, role, port, mb, tree = sys.argv[2:7]
        if system == "torchft":
            result = child_torchft(role, int(port), int(mb))
        else:
            result = child_meshrun(role, int(port), int(mb), tree)
        print(json.dumps(result), flush=True)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default="meshrun,torchft")
    parser.add_argument("--main-tree", default="", help="a checkout's python/ (meshrun-main)")
    args = parser.parse_args()
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    systems = args.systems.split(",")
    if "meshrun-main" in systems and not args.main_tree:
        parser.error("meshrun-main needs --main-tree")
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for system in systems:  # alternating, so that load drifts hit both alike
            for result in run_once(system, args.mb, args.main_tree, here):
                runs.setdefault((system, result["role"]), []).append(result)
                print(f"round {r} {system:12} {result['role']:9} "
                      f"peak {result['peak_mb']:7.0f} MiB (state and all: "
                      f"{result['rss_before_mb']:6.0f} before, {result['above_mb']:6.0f} above) "
                      f"{result['seconds']:6.2f} s", flush=True)  # fmt: skip
    print(f"\nheal of {max(1, args.mb // TENSOR_MB) * TENSOR_MB} MiB of float32 state, "
          f"medians of {args.rounds} rounds (MiB; 'above': peak RSS minus RSS before "
          "the heal)")  # fmt: skip
    print(f"{'system':12} {'role':9} {'peak':>7} {'above':>7} {'seconds':>8}")
    medians = {}
    for (system, role), results in runs.items():
        peak = statistics.median(x["peak_mb"] for x in results)
        above = statistics.median(x["above_mb"] for x in results)
        took = statistics.median(x["seconds"] for x in results)
        medians[(system, role)] = (peak, above, took)
        print(f"{system:12} {role:9} {peak:7.0f} {above:7.0f} {took:8.2f}")
    if "meshrun" in systems and "torchft" in systems:
        for role in ROLES:
            ours, theirs = medians[("meshrun", role)], medians[("torchft", role)]
            print(f"ratio meshrun/torchft {role:9}: peak {ours[0] / theirs[0]:.2f}x, "
                  f"above the state {ours[1]:.0f} MiB against {theirs[1]:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()

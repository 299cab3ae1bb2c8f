#!/usr/bin/env python3
"""meshrun --ray against Ray Train's TorchTrainer on one Ray cluster.

Both run seed 003's TP + PP function as a training loop (seed003_train.py:
four ranks, two per node, gloo on CPU) on the same cluster, started on this
machine's loopback: a head holding no CPUs and three nodes of 2 CPUs.

  meshrun     meshrun --ray=ADDRESS --nnodes=2 --nproc-per-node=2
              --max-restarts=3 seed003_train.py MARKS STOP
  ray-train   python bench_ray.py ray-train ADDRESS MARKS STOP: seed 003's
              way, TorchTrainer(train, ScalingConfig(num_workers=4,
              use_gpu=False)), with FailureConfig(max_failures=3)

Per run, from the ranks' marks (each step's end, on every rank):

  first step   seconds from the command's start to the end of step 0 on
               all four ranks
  back         once every rank has done 3 steps, rank 2's Ray node is
               SIGKILLed: its raylet and every process it started (as when
               its machine dies);
               seconds from then to the end of a step 0 on all four ranks in
               fresh processes (on the surviving node and the spare one)

Then the stop file ends the run, a node replaces the dead one, and once Ray
has marked the dead node dead, the other system goes. Rounds alternate the
systems' order. Output: a markdown table of medians and the ratios
meshrun / Ray Train (below 1: meshrun faster).

Run under `unshare --net --pid --fork --mount-proc` (scripts/bench-ray.sh),
so that the cluster and all it starts end with this script.
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))

from ray_cluster import Cluster  # noqa: E402

SYSTEMS = ("meshrun", "ray-train")
RANKS = 4


@dataclass
class Mark:
    rank: int
    step: int
    time: float
    pid: int
    node: str


def read_marks(path: str) -> list[Mark]:
    marks = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 5:  # a line being written is left for the next read
                rank, step, at, pid, node = fields
                marks.append(Mark(int(rank), int(step), float(at), int(pid), node))
    return marks


def wait_for(what: str, deadline: float, probe, proc: subprocess.Popen):
    """probe() until it returns something other than None."""
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
        if proc.poll() is not None:
            raise TimeoutError(f"it exited ({proc.returncode}) before {what}")
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def all_ranks_step0(path: str, after: float, old_pids: set[int]) -> float | None:
    """When step 0 ended on every rank in a process started after ``after``
    (fresh pids only), or None before that."""
    ends: dict[int, float] = {}
    for m in read_marks(path):
        if m.step == 0 and m.time > after and m.pid not in old_pids:
            ends.setdefault(m.rank, m.time)
    return max(ends.values()) if len(ends) == RANKS else None


def command(system: str, args: argparse.Namespace, address: str, marks: str, stop: str):
    if system == "meshrun":
        return [
            args.meshrun,
            f"--ray={address}",
            "--nnodes=2",
            "--nproc-per-node=2",
            "--max-restarts=3",
            os.path.join(HERE, "seed003_train.py"),
            marks,
            stop,
        ]
    return [sys.executable, os.path.abspath(__file__), "ray-train", address, marks, stop]


def one_run(system: str, args: argparse.Namespace, cluster: Cluster, work: str):
    marks, stop = os.path.join(work, f"{system}.marks"), os.path.join(work, f"{system}.stop")
    open(marks, "w").close()
    if os.path.exists(stop):
        os.remove(stop)  # the last round's
    log = open(os.path.join(args.log_dir, f"{system}-{int(time.time())}.log"), "w")
    env = dict(os.environ, PYTHON_EXEC=sys.executable)
    start = time.time()
    proc = subprocess.Popen(
        command(system, args, cluster.address, marks, stop),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + args.timeout
    try:
        step0 = wait_for("step 0", deadline, lambda: all_ranks_step0(marks, start, set()), proc)
        first = step0 - start

        def three_steps():
            done = {m.rank for m in read_marks(marks) if m.step >= 2}
            return True if len(done) == RANKS else None

        wait_for("three steps", deadline, three_steps, proc)
        before = read_marks(marks)
        victim = next(m.node for m in before if m.rank == 2)
        killed_at = time.time()
        cluster.kill_node(victim)
        old = {m.pid for m in before}
        recovered = wait_for(
            "a step after the kill", deadline, lambda: all_ranks_step0(marks, killed_at, old), proc
        )
        back = recovered - killed_at
        open(stop, "w").close()
        code = proc.wait(timeout=max(1, deadline - time.monotonic()))
        return first, back, code
    except (TimeoutError, subprocess.TimeoutExpired) as e:
        print(f"{system}: {e}; see {log.name}", file=sys.stderr)
        return None, None, None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        # Back to three nodes, and the next run starts once Ray has marked
        # the dead one dead (else the next system pays for Ray's stale view).
        cluster.add_node()
        cluster.wait_alive(3)


def ray_train(address: str, marks: str, stop: str) -> None:
    """Seed 003's way: TorchTrainer over the training function."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from seed003_train import train

    ray.init(address=address, logging_level="ERROR")
    trainer = TorchTrainer(
        train,
        train_loop_config={"marks": marks, "stop": stop},
        scaling_config=ScalingConfig(num_workers=RANKS, use_gpu=False),
        run_config=RunConfig(
            storage_path=os.path.join(os.path.dirname(marks), "ray-results"),
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    trainer.fit()


def median(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    return f"{statistics.median(got):.2f}" if got else "—"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "ray-train":
        ray_train(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300, help="per run, seconds")
    parser.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    if os.getpid() != 1:
        sys.exit("bench_ray.py: run it under unshare --net --pid --fork --mount-proc")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.makedirs(args.log_dir, exist_ok=True)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray's workers (Ray Train's) import the training function from here.
    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    results: dict[str, list[tuple]] = {s: [] for s in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix="ray-") as temp:
        cluster = Cluster(ray, os.path.join(temp, "ray"), nodes=3)
        try:
            for r in range(args.rounds):
                for system in SYSTEMS if r % 2 == 0 else reversed(SYSTEMS):
                    got = one_run(system, args, cluster, temp)
                    results[system].append(got)
                    print(
                        f"round {r + 1} {system}: first step {got[0]}, back {got[1]}, "
                        f"exit {got[2]}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            cluster.stop()
    rows = {s: ([r[0] for r in results[s]], [r[1] for r in results[s]]) for s in SYSTEMS}
    print(f"Medians of {args.rounds} runs each, seconds.\n")
    print("| system | finished | command to first step | back to training after a node died |")
    print("|---|---:|---:|---:|")
    names = {"meshrun": "meshrun --ray", "ray-train": "Ray Train TorchTrainer"}
    for s in SYSTEMS:
        finished = sum(1 for r in results[s] if r[2] == 0)
        print(
            f"| {names[s]} | {finished}/{args.rounds} | {median(rows[s][0])} | "
            f"{median(rows[s][1])} |"
        )

    def ratio(i: int) -> str:
        ours, theirs = median(rows["meshrun"][i]), median(rows["ray-train"][i])
        if "—" in (ours, theirs):
            return "—"
        return f"{float(ours) / float(theirs):.2f}x"

    print(f"| ratio meshrun / Ray Train | | {ratio(0)} | {ratio(1)} |")


if __name__ == "__main__":
    main()

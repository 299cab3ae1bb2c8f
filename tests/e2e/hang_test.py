"""--hang-timeout and meshrun.heartbeat() (issue 32), with real launches.

ddp: a 2-node DDP job (two agents on one meshrun-rdzvd, 2 workers each,
Gloo) whose last rank SIGSTOPs itself mid-training. Every other rank then
waits in the all-reduce, so no worker uses CPU time or writes anything.
Each agent notices within the timeout, prints its workers' stacks (py-spy:
the stopped rank's frame names `hold`), stops them as failed, and the job
restarts once and trains to the end. The same job under torchrun 2, for
comparison: how long it takes to notice, bounded by the test (Gloo's
collective timeout is 30 minutes by default).

heartbeat: one worker sends heartbeats, then spins at a full core without
them: CPU time alone would call it busy; its missing heartbeats catch it. A
heartbeat from its forked child (not a worker) is refused and logged.

flood (issue 44 item 9): while a process floods the agent's heartbeat
socket as fast as it can, a worker heartbeats for 4 s under --hang-timeout=2
and exits: it is never judged hung (its heartbeats still arrive), the flood
is refused, and the agent notices the exit and ends the run (and the
flooder, in the worker's process group) within the bound.

stragglers: a 2-node job whose workers heartbeat with their step times, rank
3's three times the others': the daemon's status page lists rank 3 as slow,
/metrics has every rank's step time, and the daemon logs it.

Run under `unshare --net --pid --fork --mount-proc`: torchrun's workers are
ended with the namespace, and its store's fixed port is free.

Usage: hang_test.py --meshrun BIN --python PY --torchrun T --pythonpath P CASE
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from launched import Daemon, Run

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")
DDP_TIMEOUT_S = 10
SPIN_TIMEOUT_S = 3
BOUND_S = 150
STOPPING = "rank 3: stopping myself"


def environment(args: argparse.Namespace) -> dict[str, str]:
    return dict(os.environ, PYTHON_EXEC=args.python, PYTHONPATH=args.pythonpath)


def seconds_until(run: Run, pattern: str, since: float, deadline: float) -> float:
    if not run.wait_for(pattern, deadline):
        raise AssertionError(f"never saw {pattern!r}:\n" + "\n".join(run.output()[-40:]))
    return time.monotonic() - since


def wait_for_stop(nodes: list[Run], deadline: float) -> Run:
    """The node whose rank stopped itself, once it says so."""
    while time.monotonic() < deadline and all(node.proc.poll() is None for node in nodes):
        for node in nodes:
            if any(STOPPING in line for line in node.output()):
                return node
        time.sleep(0.05)
    raise AssertionError("\n".join(nodes[0].output()[-30:] + nodes[1].output()[-30:]))


def case_ddp(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    flags = [
        *daemon.run_flags("hang", "2", 2),
        "--max-restarts=1",
        f"--hang-timeout={DDP_TIMEOUT_S}",
    ]
    nodes = [Run([args.meshrun, *flags, WORKER], environment(args)) for _ in range(2)]
    try:
        holder = wait_for_stop(nodes, deadline)
        stopped_at = time.monotonic()
        noticed = seconds_until(holder, r"\[error\] hang: local ranks", stopped_at, deadline)
        codes = [node.finish(deadline) for node in nodes]
    finally:
        for node in nodes:
            node.stop()
        daemon.stop()
    out = [node.output() for node in nodes]
    everything = "\n".join(out[0] + out[1])
    if os.environ.get("HANG_TEST_VERBOSE"):
        print(everything)
    assert codes == [0, 0], f"exit codes {codes}:\n{everything}"
    for lines in out:
        text = "\n".join(lines)
        hang = re.search(r"made no progress for ([\d.]+) s \(no CPU time and no output\)", text)
        assert hang and DDP_TIMEOUT_S <= float(hang.group(1)) < 2 * DDP_TIMEOUT_S, text
        assert "Python stacks (py-spy dump)" in text, text
    assert re.search(r"hold \(hang_worker\.py:\d+\)", "\n".join(holder.output())), everything
    assert "  hang      : no progress for" in everything, everything
    done = sorted(re.findall(r"rank (\d): done \(restart 1\)", everything))
    assert done == ["0", "1", "2", "3"], everything
    # The agent samples every timeout/10: noticed within the timeout and a
    # little more (the stacks come before the line only in the log's order).
    assert noticed < 2 * DDP_TIMEOUT_S, f"noticed {noticed:.1f} s after the stop"
    print(
        f"ok: meshrun noticed the stopped rank {noticed:.1f} s after it stopped "
        f"(--hang-timeout={DDP_TIMEOUT_S}), printed the stacks, and the job trained to the end "
        "after one restart"
    )

    # torchrun 2, the same job, bounded at twice the timeout. Its c10d store
    # takes the fixed port this test's own network namespace leaves free.
    bound = 2 * DDP_TIMEOUT_S
    deadline = time.monotonic() + BOUND_S
    torch_flags = [
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:29500",
        "--rdzv-id=hang",
        "--max-restarts=1",
    ]
    nodes = [Run([args.torchrun, *torch_flags, WORKER], environment(args)) for _ in range(2)]
    try:
        wait_for_stop(nodes, deadline)
        stopped_at = time.monotonic()
        noticed_by = stopped_at + bound
        while time.monotonic() < noticed_by and all(n.proc.poll() is None for n in nodes):
            if any(
                "restart 1" in line or "Traceback" in line for n in nodes for line in n.output()
            ):
                break
            time.sleep(0.1)
        took = time.monotonic() - stopped_at
        codes = [node.proc.poll() for node in nodes]
    finally:
        for node in nodes:
            node.stop()
    if took >= bound:
        print(
            f"torchrun 2 for comparison: nothing noticed {took:.0f} s after the stop (it waits "
            "for Gloo's collective timeout, 30 minutes by default); the test ended it"
        )
    else:
        print(f"torchrun 2 for comparison: something happened after {took:.1f} s: exit {codes}")


def run_one_worker(
    args: argparse.Namespace, mode: str, max_restarts: int, hang_timeout_s: float, bound_s: float
) -> tuple[int, str]:
    """hang_worker.py `mode` as one worker under --hang-timeout: its exit
    code (-1: still running after `bound_s`) and its output."""
    command = [
        args.meshrun,
        "--standalone",
        "--nproc-per-node=1",
        f"--max-restarts={max_restarts}",
        f"--hang-timeout={hang_timeout_s:g}",
        WORKER,
        mode,
    ]
    run = Run(command, environment(args))
    try:
        code = run.finish(time.monotonic() + bound_s)
    finally:
        run.stop()
    return code, "\n".join(run.output())


def case_heartbeat(args: argparse.Namespace) -> None:
    code, text = run_one_worker(
        args, "spin", max_restarts=1, hang_timeout_s=SPIN_TIMEOUT_S, bound_s=BOUND_S
    )
    assert code == 0, f"exit {code}:\n{text}"
    child = re.search(r"a child \(pid (\d+)\) sent a heartbeat", text)
    assert child, text
    refused = f"heartbeats: refused one from pid {child.group(1)}, not one of this agent's"
    assert refused in text, text
    assert f"made no progress for {SPIN_TIMEOUT_S}" in text and "(no heartbeat)" in text, text
    assert "rank 0: done (restart 1)" in text, text
    print("ok: the spinning worker was caught by its missing heartbeats; its child's refused")


def case_flood(args: argparse.Namespace) -> None:
    bound_s = 40  # the run takes about 5 s
    code, text = run_one_worker(args, "flood", max_restarts=0, hang_timeout_s=2, bound_s=bound_s)
    assert code == 0, f"exit {code} (-1: still running after {bound_s} s):\n{text}"
    assert "rank 0: done (restart 0)" in text, text
    assert "made no progress" not in text, text
    assert re.search(r"heartbeats: refused one from pid \d+, not one of this agent's", text), text
    print("ok: through a flood of heartbeats the worker was not judged hung; the run ended")


def case_stragglers(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    flags = [*daemon.run_flags("steps", "2", 2), "--rdzv-conf=keep_alive_interval=1"]
    nodes = [Run([args.meshrun, *flags, WORKER, "steps"], environment(args)) for _ in range(2)]
    try:
        codes = [node.finish(deadline) for node in nodes]
        with urllib.request.urlopen(f"http://{daemon.metrics}/api/status", timeout=10) as reply:
            status = json.load(reply)
        with urllib.request.urlopen(f"http://{daemon.metrics}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
    finally:
        for node in nodes:
            node.stop()
        daemon.stop()
    everything = "\n".join(nodes[0].output() + nodes[1].output())
    assert codes == [0, 0], f"exit codes {codes}:\n{everything}"
    (run,) = [r for r in status["runs"] if r["run_id"] == "steps"]
    slow = run["slow_ranks"]
    assert [s["rank"] for s in slow] == [3], json.dumps(run, indent=1)
    assert slow[0]["mean_step_ms"] == 30 and slow[0]["times_median"] == 3, slow
    ranks = re.findall(
        r'^meshrun_rank_step_seconds\{run="steps",rank="(\d)"\} (\S+)$', metrics, re.M
    )
    seconds = {rank: round(float(value), 6) for rank, value in ranks}
    assert seconds == {"0": 0.01, "1": 0.01, "2": 0.01, "3": 0.03}, ranks
    logged = [line for line in daemon.output() if "a straggler" in line]
    assert len(logged) == 1 and "rank 3 on node" in logged[0], daemon.output()
    print("ok: rank 3 shown slow at 3x the median; logged:", logged[0].split("] ")[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--torchrun", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("case", choices=["ddp", "heartbeat", "flood", "stragglers"])
    args = parser.parse_args()
    if os.getpid() != 1:
        sys.exit("hang_test.py: run it under unshare --net --pid --fork --mount-proc")
    # A new network namespace starts with loopback down.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    {
        "ddp": case_ddp,
        "heartbeat": case_heartbeat,
        "flood": case_flood,
        "stragglers": case_stragglers,
    }[args.case](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

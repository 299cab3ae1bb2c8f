#!/usr/bin/env python3
"""The coordinator killed mid-training: meshrun's daemon restarted from its
state dir, meshrun's daemon replicas on etcd (nothing restarted: a standby
takes over), and torchft's Lighthouse restarted, under the same Python
program (ft_python_recovery.py: the recovery benchmark's GPT, four replica
groups of one worker, gloo on CPU).

  meshrun       meshrun-rdzvd --state-dir D on 127.0.0.1, and
                meshrun --rdzv-backend=c10d --rdzv-endpoint=... --restart-scope=replica
                --replica-size=1 --nproc-per-node=4 ft_python_recovery.py --system meshrun
  meshrun-etcd  a one-member etcd and two meshrun-rdzvd --etcd-endpoints on
                127.0.0.1 (the daemon's default lease, 3 s), the same job with
                --rdzv-endpoint=LEADER,STANDBY
  torchft       torchft_lighthouse with its README's flags, and one torchrun per
                replica group (torchft_launch.py --lighthouse-url)

When the step --kill-at-step's line comes, the coordinator (the leading
daemon) is SIGKILLed; it is started again --down seconds later on the same
port (the daemon with the same state dir; with etcd, nothing is started:
the standby takes over). Per run:

  finished     the job's exit code is 0 and it printed its last step
  restarts     worker processes started again (a worker's start line with
               incarnation > 0)
  discarded    steps voted down (the programs' "step S discarded" lines)
  steps lost   committed steps trained again: the highest step committed
               before the coordinator's return + 1 - the lowest step
               committed after it (all of them when training starts over
               from step 0)
  stalled s    seconds from the coordinator's return to the next committed
               step's line, less one step time (the median gap between step
               lines before the kill): what the return costs beyond the
               outage itself (with etcd: from the kill)
  failover s   seconds from the kill to the next committed step's line, less
               one step time: the outage and the return together

--check (the ctest smoke) fails unless every meshrun run finished without a
worker restart and lost no committed step. Output: a markdown table of
medians over --rounds runs each.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child in its own session, its output lines timestamped as read."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def output(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.lines)

    def tail(self, lines: int = 20) -> str:
        """Its last output lines, for a message saying why it failed."""
        return "\n".join(line for _, line in self.output()[-lines:])

    def wait_for(self, pattern: str, deadline: float) -> float | None:
        """The time the first line matching `pattern` was read."""
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            for t, line in self.output():
                if regex.search(line):
                    return t
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._reader.join(timeout=5)


class Coordinator:
    """The daemon or the Lighthouse, killed and started again on its port."""

    def __init__(self, args: argparse.Namespace, system: str, work: str) -> None:
        self._args, self._system, self._work = args, system, work
        self._state_dir = os.path.join(work, "state")
        self.port = free_port()
        self._etcd: Process | None = None
        self._standby: Process | None = None
        if system == "meshrun-etcd":
            self.process = self._start_replicas()
            return
        self.process = self._start()
        self.endpoint = f"127.0.0.1:{self.port}"

    def _start_replicas(self) -> Process:
        """A one-member etcd, then a leader and a standby on it."""
        client, peer = free_port(), free_port()
        self._etcd = Process(
            ["etcd", "--name=bench", f"--data-dir={os.path.join(self._work, 'etcd')}",
             f"--listen-client-urls=http://127.0.0.1:{client}",
             f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=bench=http://127.0.0.1:{peer}"],
            dict(os.environ),
        )  # fmt: skip
        standby_port = free_port()

        def replica(port: int) -> Process:
            command = [self._args.rdzvd, "--host=127.0.0.1", f"--port={port}",
                       f"--etcd-endpoints=127.0.0.1:{client}", "--log-level=warn"]  # fmt: skip
            return Process(command, dict(os.environ))

        leader = replica(self.port)
        if leader.wait_for("^MESHRUN_RDZVD_ENDPOINT=", time.monotonic() + 60) is None:
            raise SystemExit(f"coordinator_restart: no meshrun-rdzvd led on etcd:\n{leader.tail()}")
        self._standby = replica(standby_port)
        if self._standby.wait_for("^MESHRUN_RDZVD_STANDBY=", time.monotonic() + 30) is None:
            why = self._standby.tail()
            raise SystemExit(
                f"coordinator_restart: the standby meshrun-rdzvd did not start:\n{why}"
            )
        self.endpoint = f"127.0.0.1:{self.port},127.0.0.1:{standby_port}"
        return leader

    def _start(self) -> Process:
        if self._system == "meshrun":
            command = [self._args.rdzvd, "--host=127.0.0.1", f"--port={self.port}",
                       f"--state-dir={self._state_dir}", "--log-level=warn"]  # fmt: skip
            process = Process(command, dict(os.environ))
            if process.wait_for("^MESHRUN_RDZVD_ENDPOINT=", time.monotonic() + 30) is None:
                raise SystemExit("coordinator_restart: meshrun-rdzvd did not start")
            return process
        command = [self._args.lighthouse, "--min_replicas", "1", "--quorum_tick_ms", "100",
                   "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{self.port}"]  # fmt: skip
        process = Process(command, dict(os.environ))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # listening
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return process
            time.sleep(0.05)
        raise SystemExit("coordinator_restart: torchft_lighthouse did not start")

    def kill(self) -> None:
        self.process.stop()  # SIGKILL to its process group

    def restart(self) -> None:
        if self._system != "meshrun-etcd":  # there, the standby takes over
            self.process = self._start()

    def stop_all(self) -> None:
        for process in (self.process, self._standby, self._etcd):
            if process is not None:
                process.stop()


def job_command(args: argparse.Namespace, system: str, coordinator: Coordinator) -> list[str]:
    program = [os.path.join(HERE, "ft_python_recovery.py"), f"--system={system}",
               f"--sizes={args.sizes}", f"--steps={args.steps}"]  # fmt: skip
    if system.startswith("meshrun"):
        program[1] = "--system=meshrun"
        return [args.meshrun, "--nnodes=1", "--nproc-per-node=4", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={coordinator.endpoint}", "--rdzv-id=coordinator",
                "--restart-scope=replica", "--replica-size=1", "--max-restarts=3",
                "--no-python", args.python, "-u", *program]  # fmt: skip
    return [args.python, os.path.join(HERE, "torchft_launch.py"), "--groups=4",
            "--max-restarts=3", f"--torchrun={args.torchrun}", f"--lighthouse={args.lighthouse}",
            f"--lighthouse-url=http://{coordinator.endpoint}", "--", *program]  # fmt: skip


@dataclass
class Outcome:
    finished: bool
    restarts: int
    discarded: int
    steps_lost: int
    stalled_s: float | None  # None: no step committed after the return
    failover_s: float | None  # None: no step committed after the kill
    ending: str = ""  # how the job ended: its exit code, or the timeout
    log: list[str] = field(default_factory=list)


STEP = re.compile(r"^step (\d+) loss ")


def run_once(args: argparse.Namespace, system: str) -> Outcome:
    work = tempfile.mkdtemp(prefix="coordinator-restart-")
    coordinator = Coordinator(args, system, work)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC=args.python, PYTHONUNBUFFERED="1")
    job = Process(job_command(args, system, coordinator), env)
    deadline = time.monotonic() + args.timeout
    timed_out = False
    try:
        t_kill = job.wait_for(f"^step {args.kill_at_step} loss ", deadline)
        if t_kill is None:
            return Outcome(False, 0, 0, 0, None, None, log=[line for _, line in job.output()])
        coordinator.kill()
        t_killed = time.monotonic()
        if system != "meshrun-etcd":
            time.sleep(args.down)
        coordinator.restart()
        t_back = time.monotonic()
        try:
            job.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        job.stop()
        coordinator.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    lines = job.output()
    text = [line for _, line in lines]
    steps = [(t, int(m.group(1))) for t, line in lines if (m := STEP.match(line))]
    before = [t for t, s in steps if t <= t_kill]
    step_time = statistics.median(b - a for a, b in zip(before, before[1:], strict=False))
    after = [t for t, _ in steps if t > t_back]
    after_kill = [t for t, _ in steps if t > t_killed]
    high_before = max(s for t, s in steps if t <= t_back)
    low_after = min((s for t, s in steps if t > t_back), default=high_before + 1)
    starts = [re.search(r"incarnation (\d+)", line) for line in text if " pid " in line]
    return Outcome(
        finished=job.proc.returncode == 0 and any(s == args.steps - 1 for _, s in steps),
        restarts=sum(1 for m in starts if m and int(m.group(1)) > 0),
        discarded=sum(1 for line in text if re.match(r"^(meshrun\.ft: )?step \d+ discarded", line)),
        steps_lost=max(0, high_before + 1 - low_after),
        stalled_s=(after[0] - t_back - step_time) if after else None,
        failover_s=(after_kill[0] - t_killed - step_time) if after_kill else None,
        log=text,
        ending=f"killed at the {args.timeout:g} s timeout"
        if timed_out
        else f"exit code {job.proc.returncode}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--rdzvd", help="default: meshrun-rdzvd beside --meshrun")
    parser.add_argument("--torchrun", help="the venv's torchrun (system torchft)")
    parser.add_argument("--lighthouse", help="default: torchft_lighthouse beside --torchrun")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--systems", default="meshrun,meshrun-etcd,torchft")
    parser.add_argument("--sizes", default="bench")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kill-at-step", type=int, default=20)
    parser.add_argument("--down", type=float, default=2.0, help="seconds the coordinator is gone")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--log-dir", help="each run's output, one file a run")
    args = parser.parse_args()
    systems = args.systems.split(",")
    args.rdzvd = args.rdzvd or os.path.join(os.path.dirname(args.meshrun), "meshrun-rdzvd")
    if "torchft" in systems:
        if not args.torchrun:
            parser.error("--torchrun is needed for torchft")
        args.lighthouse = args.lighthouse or os.path.join(
            os.path.dirname(args.torchrun), "torchft_lighthouse"
        )
    if not 0 < args.kill_at_step < args.steps - 1:
        parser.error("--kill-at-step must fall inside the run")

    print(f"The coordinator SIGKILLed at step {args.kill_at_step} of {args.steps}, back "
          f"{args.down:g} s later on its port (with etcd: not started again, the standby "
          f"leads); medians of {args.rounds} runs.\n")  # fmt: skip
    print(
        "| system | finished | worker restarts | steps discarded | committed steps lost "
        "| stalled after its return (s) | failover: kill to next step (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    failed = False
    for system in systems:
        outcomes = []
        for round_index in range(args.rounds):
            outcome = run_once(args, system)
            outcomes.append(outcome)
            print(f"{system} round {round_index + 1}: {outcome.ending}, "
                  f"{outcome.restarts} worker restarts, {outcome.discarded} discarded, "
                  f"{outcome.steps_lost} committed steps lost, stalled {outcome.stalled_s} s, "
                  f"failover {outcome.failover_s} s",
                  file=sys.stderr, flush=True)  # fmt: skip
            if args.log_dir:
                os.makedirs(args.log_dir, exist_ok=True)
                path = os.path.join(args.log_dir, f"{system}-{round_index}.log")
                with open(path, "w") as f:
                    f.write("\n".join(outcome.log) + "\n")
            kept = outcome.finished and outcome.restarts == 0 and outcome.steps_lost == 0
            if system.startswith("meshrun") and not kept:
                failed = True
                print("\n".join(outcome.log[-40:]), file=sys.stderr)
        stalls = [o.stalled_s for o in outcomes if o.stalled_s is not None]
        stalled = f"{statistics.median(stalls):.2f}" if stalls else "none"
        failovers = [o.failover_s for o in outcomes if o.failover_s is not None]
        failover = f"{statistics.median(failovers):.2f}" if failovers else "none"
        name = {
            "meshrun": "meshrun.ft, meshrun-rdzvd --state-dir",
            "meshrun-etcd": "meshrun.ft, two meshrun-rdzvd on etcd",
        }.get(system, "torchft 0.2.0")
        print(f"| {name} | {sum(o.finished for o in outcomes)}/{len(outcomes)} "
              f"| {statistics.median(o.restarts for o in outcomes):g} "
              f"| {statistics.median(o.discarded for o in outcomes):g} "
              f"| {statistics.median(o.steps_lost for o in outcomes):g} "
              f"| {stalled} | {failover} |", flush=True)  # fmt: skip
    if args.check and failed:
        print("coordinator_restart: a meshrun run restarted or lost steps", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

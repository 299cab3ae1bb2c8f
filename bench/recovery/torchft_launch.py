#!/usr/bin/env python3
"""torchft's launch, as its README gives it, as one command for the recovery
benchmark: a Lighthouse (torchft_lighthouse --min_replicas 1 --quorum_tick_ms
100 --join_timeout_ms 10000) and one torchrun per replica group, each with
TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID and NUM_REPLICA_GROUPS, whose
--max-restarts restarts a failed group alone.

    torchft_launch.py --groups 4 --max-restarts K --torchrun T --lighthouse L -- SCRIPT ARGS...

With --lighthouse-url, the groups use that Lighthouse and none is started.
With --meshrun M instead of --torchrun, each group is launched by meshrun
(meshrun --standalone --nproc-per-node=1 --max-restarts=K SCRIPT): torchft's
users keep their habit of one launcher per replica group, with meshrun in
torchrun's place (tests/e2e/ft_python_test.py's `torchft` case).

Every process's output comes out on stdout, a line at a time. Exit code: 0
when every group finished, else the first non-zero one. SIGTERM or SIGINT
stops everything it started.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, default=0)
    launcher = parser.add_mutually_exclusive_group(required=True)
    launcher.add_argument("--torchrun")
    launcher.add_argument("--meshrun")
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument(
        "--lighthouse-url", help="a Lighthouse already running (coordinator_restart.py's)"
    )
    parser.add_argument("script", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script

    out_lock = threading.Lock()

    def pump(stream) -> None:
        for raw in iter(stream.readline, b""):
            with out_lock:
                sys.stdout.buffer.write(raw)
                sys.stdout.flush()

    started: list[subprocess.Popen] = []

    def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        started.append(proc)
        threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
        return proc

    def stop_all(*_: object) -> None:
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, lambda *a: (stop_all(), sys.exit(143)))
    signal.signal(signal.SIGINT, lambda *a: (stop_all(), sys.exit(130)))
    barrier = tempfile.mkdtemp(prefix="torchft-bench-barrier-")
    try:
        url = args.lighthouse_url
        if not url:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            start(
                [args.lighthouse, "--min_replicas", "1", "--quorum_tick_ms", "100",
                 "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{port}"],
                dict(os.environ),
            )  # fmt: skip
        groups = []
        for group in range(args.groups):
            env = dict(os.environ)
            env.update(
                PYTHON_EXEC=sys.executable,  # meshrun's python (torchrun uses its own)
                TORCHFT_LIGHTHOUSE=url,
                REPLICA_GROUP_ID=str(group),
                NUM_REPLICA_GROUPS=str(args.groups),
                TORCHFT_BENCH_BARRIER=barrier,  # ft_python_recovery.py's start_together
            )
            groups.append(
                start(
                    [
                        args.torchrun or args.meshrun,
                        "--standalone",
                        "--nnodes=1",
                        "--nproc-per-node=1",
                        f"--max-restarts={args.max_restarts}",
                        *script,
                    ],
                    env,
                )  # fmt: skip
            )
        codes = [proc.wait() for proc in groups]
    finally:
        stop_all()
        shutil.rmtree(barrier, ignore_errors=True)
    sys.exit(next((c for c in codes if c != 0), 0))


if __name__ == "__main__":
    main()

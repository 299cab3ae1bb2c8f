"""--health-check (issue 32): a node whose check fails stays out of the run.

On one meshrun-rdzvd, an elastic run (--nnodes=1:2, one worker a node):
- nodes A and B form the first round; B's check (`test ! -e FLAG`) passes;
- B's worker creates FLAG and fails: the run re-forms, B's check now fails,
  and B says which check and its output, leaves, and exits 69;
- A trains on alone (world size 1) and the run succeeds;
- node C joins with a check that hangs (`sleep 60`, --health-check-timeout
  1): it fails at its timeout and C exits 69 without joining;
- meanwhile the daemon's status page (/api/status) shows B and C unhealthy,
  with their checks, and /metrics counts them.

Usage: health_check_test.py --meshrun BIN --python PY
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request

from launched import Daemon, Run

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "health_check_worker.py")
BOUND_S = 120
UNHEALTHY_EXIT = 69


def status(daemon: Daemon) -> dict:
    with urllib.request.urlopen(f"http://{daemon.metrics}/api/status", timeout=10) as reply:
        return json.load(reply)


def metrics(daemon: Daemon) -> str:
    with urllib.request.urlopen(f"http://{daemon.metrics}/metrics", timeout=10) as reply:
        return reply.read().decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    args = parser.parse_args()
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    env = dict(os.environ, PYTHON_EXEC=args.python)
    nodes: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="health-check-") as work:
        flag = os.path.join(work, "sick")
        flags = [
            "--nnodes=1:2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={daemon.endpoint}",
            "--rdzv-id=health",
            "--rdzv-conf=last_call_timeout=1",
            "--max-restarts=2",
        ]

        def launch(name: str, *checks: str) -> Run:
            nodes[name] = Run([args.meshrun, *flags, *checks, WORKER, flag], env)
            return nodes[name]

        try:
            a = launch("A", "--health-check=true")
            b = launch("B", "--health-check=true", f"--health-check=test ! -e {flag}")
            for run in (a, b):
                if not run.wait_for(r"round 1: group rank \d/2", deadline):
                    raise AssertionError("\n".join(run.output()[-30:]))
            b_code = b.finish(deadline)
            c = launch("C", "--health-check=echo checking; sleep 60", "--health-check-timeout=1")
            c_code = c.finish(deadline)
            page = status(daemon)
            text = metrics(daemon)
            a_code = a.finish(deadline)
        finally:
            for run in nodes.values():
                run.stop()
            daemon.stop()
    out = {name: "\n".join(run.output()) for name, run in nodes.items()}
    everything = "\n".join(f"--- {n}\n{o}" for n, o in out.items())
    if os.environ.get("HEALTH_TEST_VERBOSE"):
        print(everything)
    assert (a_code, b_code, c_code) == (0, UNHEALTHY_EXIT, UNHEALTHY_EXIT), (
        f"exit codes A {a_code}, B {b_code}, C {c_code}:\n{everything}"
    )
    assert re.search(
        rf"before the restart: health check 'test ! -e {re.escape(flag)}' failed \(exit 1\); "
        "this node stays out of run health",
        out["B"],
    ), out["B"]
    assert re.search(r"^rank 0 of 1, restart [12]$", out["A"], re.M), out["A"]
    assert re.search(
        r"before joining: health check 'echo checking; sleep 60' failed \(took over 1 s\): "
        "checking; this node stays out of run health",
        out["C"],
    ), out["C"]
    assert "rank " not in out["C"], out["C"]

    (run,) = [r for r in page["runs"] if r["run_id"] == "health"]
    unhealthy = {n["health"] for n in run["nodes"] if n["state"] == "unhealthy"}
    assert unhealthy == {
        f"health check 'test ! -e {flag}' failed (exit 1)",
        "health check 'echo checking; sleep 60' failed (took over 1 s): checking",
    }, json.dumps(run, indent=1)
    assert 'meshrun_run_nodes{run="health",state="unhealthy"} 2' in text, text
    print(
        "ok: B left at the restart on its failing check, C's hanging check failed at 1 s; "
        "A trained alone; the status page shows both unhealthy"
    )


if __name__ == "__main__":
    sys.exit(main())

"""--health-check (issue 32): a node whose check fails stays out of the run.

keep_out: on one meshrun-rdzvd, an elastic run (--nnodes=1:2, one worker a
  node):
  - nodes A and B form the first round; B's check (`test ! -e FLAG`) passes;
  - B's worker creates FLAG and fails: the run re-forms, B's check now fails,
    and B says which check and its output, leaves, and exits 69;
  - A trains on alone (world size 1) and the run succeeds;
  - node C joins with a check that hangs (`sleep 60`, --health-check-timeout
    1): it fails at its timeout and C exits 69 without joining;
  - meanwhile the daemon's status page (/api/status) shows B and C unhealthy,
    with their checks, and /metrics counts them.
sigterm: SIGTERM while a node's check hangs before it joins (a 60 s timeout):
  the agent exits 143 at once, and the check's process is gone.
closed_output (issue 44 item 4): a check that closes its output and then
  hangs is as bounded as one that keeps it open: with
  --health-check-timeout=2 it fails "took over 2 s" and the node exits 69
  within a few seconds, not when the check ends (30 s); with a 60 s timeout,
  SIGTERM ends the agent at once (143) and the check with it.
rejoin: A and B in a run; B's agent is stopped (SIGSTOP) past its lease, so
  the daemon expels it and A re-forms; FLAG now exists. Continued, B re-joins
  as a new node, runs its checks again as at a re-form, fails
  `test ! -e FLAG` and exits 69.

Usage: health_check_test.py --meshrun BIN --python PY CASE
"""

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request

from launched import Daemon, Run

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "health_check_worker.py")
BOUND_S = 120
UNHEALTHY_EXIT = 69
LEASE_S = 3  # rejoin: keep_alive_interval 1 s x keep_alive_max_attempt


def status(daemon: Daemon) -> dict:
    with urllib.request.urlopen(f"http://{daemon.metrics}/api/status", timeout=10) as reply:
        return json.load(reply)


def metrics(daemon: Daemon) -> str:
    with urllib.request.urlopen(f"http://{daemon.metrics}/metrics", timeout=10) as reply:
        return reply.read().decode()


def case_keep_out(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    env = dict(os.environ, PYTHON_EXEC=args.python)
    nodes: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="health-check-") as work:
        flag = os.path.join(work, "sick")
        flags = [
            *daemon.run_flags("health", "1:2", 1),
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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def case_sigterm(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    with tempfile.TemporaryDirectory(prefix="health-check-") as work:
        pid_file = os.path.join(work, "check.pid")
        check = f"echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file} && exec sleep 60"
        node = Run(
            [
                args.meshrun,
                "--nnodes=1",
                f"--rdzv-endpoint={daemon.endpoint}",
                "--rdzv-id=health",
                f"--health-check={check}",
                "--health-check-timeout=60",
                "--no-python",
                "true",
            ],
            dict(os.environ),
        )
        try:
            while not os.path.exists(pid_file):
                assert time.monotonic() < deadline and node.proc.poll() is None, node.output()
                time.sleep(0.05)
            with open(pid_file) as f:
                check_pid = int(f.read())
            asked = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            code = node.proc.wait(timeout=max(1, deadline - time.monotonic()))
            took = time.monotonic() - asked
        finally:
            node.stop()
            daemon.stop()
    assert code == 143, f"exit {code}:\n" + "\n".join(node.output())
    assert took < 10, f"exited {took:.1f} s after SIGTERM"
    # The check was in the agent's process group's child group: killed, and
    # reaped by the agent before it exited.
    assert not alive(check_pid), f"the check (pid {check_pid}) outlived the agent"
    print(f"ok: SIGTERM during a hanging check: exit 143 in {took:.1f} s, the check ended")


def wait_for_pid(path: str, node: Run, deadline: float) -> int:
    while not os.path.exists(path):
        assert time.monotonic() < deadline and node.proc.poll() is None, node.output()
        time.sleep(0.05)
    with open(path) as f:
        return int(f.read())


def case_closed_output(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    with tempfile.TemporaryDirectory(prefix="health-check-") as work:
        pid_file = os.path.join(work, "check.pid")

        def launch(timeout_s: int) -> Run:
            # Says something, closes stdout and stderr (the agent's pipe sees
            # EOF), then hangs.
            check = (
                f"echo checking; echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file}"
                " && exec >&- 2>&- && exec sleep 30"
            )
            return Run(
                [
                    args.meshrun,
                    "--nnodes=1",
                    f"--rdzv-endpoint={daemon.endpoint}",
                    "--rdzv-id=health",
                    f"--health-check={check}",
                    f"--health-check-timeout={timeout_s}",
                    "--no-python",
                    "true",
                ],
                dict(os.environ),
            )

        nodes = []
        try:
            timed = launch(2)
            nodes.append(timed)
            started = time.monotonic()
            timed_code = timed.finish(deadline)
            timed_took = time.monotonic() - started
            timed_pid = wait_for_pid(pid_file, timed, deadline)
            os.unlink(pid_file)

            stopped = launch(60)
            nodes.append(stopped)
            check_pid = wait_for_pid(pid_file, stopped, deadline)
            asked = time.monotonic()
            stopped.proc.send_signal(signal.SIGTERM)
            stopped_code = stopped.proc.wait(timeout=max(1, deadline - time.monotonic()))
            stopped_took = time.monotonic() - asked
        finally:
            for node in nodes:
                node.stop()
            daemon.stop()
    out = "\n".join(timed.output())
    assert timed_code == UNHEALTHY_EXIT, f"exit {timed_code}:\n{out}"
    assert re.search(r"health check '.*' failed \(took over 2 s\): checking", out), out
    # The bug: the agent waited for the check's exit unbounded (30 s).
    assert timed_took < 15, f"a 2 s check timeout took {timed_took:.1f} s"
    assert not alive(timed_pid), f"the timed-out check (pid {timed_pid}) lives on"
    assert stopped_code == 143, f"exit {stopped_code}:\n" + "\n".join(stopped.output())
    assert stopped_took < 10, f"exited {stopped_took:.1f} s after SIGTERM"
    assert not alive(check_pid), f"the check (pid {check_pid}) outlived the agent"
    print(
        f"ok: a check that closed its output timed out in {timed_took:.1f} s (exit 69); "
        f"SIGTERM during one: exit 143 in {stopped_took:.1f} s, the check ended"
    )


def case_rejoin(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + BOUND_S
    daemon = Daemon(args.meshrun, deadline)
    nodes: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="health-check-") as work:
        flag = os.path.join(work, "sick")
        # A LEASE_S lease: a stopped agent is expelled soon.
        lease = f"keep_alive_interval=1,keep_alive_max_attempt={LEASE_S}"
        flags = [
            *daemon.run_flags("health", "1:2", 1),
            f"--rdzv-conf=last_call_timeout=1,{lease}",
            "--max-restarts=3",
            "--no-python",
        ]
        try:
            a = Run([args.meshrun, *flags, "--health-check=true", "sleep", "60"], dict(os.environ))
            nodes["A"] = a
            b = Run(
                [args.meshrun, *flags, f"--health-check=test ! -e {flag}", "sleep", "60"],
                dict(os.environ),
            )
            nodes["B"] = b
            for run in (a, b):
                if not run.wait_for(r"round 1: group rank \d/2", deadline):
                    raise AssertionError("\n".join(run.output()[-30:]))
            open(flag, "w").close()
            os.kill(b.proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            # A re-forms without B once the daemon has expelled it.
            if not a.wait_for(r"round 2: group rank 0/1", deadline):
                raise AssertionError("\n".join(a.output()[-30:]))
            # The stall itself (the fault simulated): B, woken well past its
            # own lease, knows it was stopped and asks the daemon, rather than
            # judging the daemon lost (exit 75).
            time.sleep(max(0.0, stopped + 2 * LEASE_S + 1 - time.monotonic()))
            os.kill(b.proc.pid, signal.SIGCONT)
            b_code = b.finish(deadline)
        finally:
            for run in nodes.values():
                run.stop()
            daemon.stop()
    out = "\n".join(b.output())
    assert b_code == UNHEALTHY_EXIT, f"B exited {b_code}:\n{out}"
    assert "expelled this node" in out, out
    assert re.search(rf"health check 'test ! -e {re.escape(flag)}' failed \(exit 1\)", out), out
    print("ok: B, expelled and re-joining, ran its checks again, failed one and exited 69")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("case", choices=["keep_out", "sigterm", "closed_output", "rejoin"])
    args = parser.parse_args()
    {
        "keep_out": case_keep_out,
        "sigterm": case_sigterm,
        "closed_output": case_closed_output,
        "rejoin": case_rejoin,
    }[args.case](args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""meshrun vs torchrun 2 (torch 2.15): launch cost, restart cost, node-loss recovery.

Run by scripts/bench-launcher.sh; stdlib only. Progress goes to stderr; the
result tables (Markdown) and one `SUMMARY_JSON {...}` line go to stdout.

  (a) launch     --standalone, 4 workers running /bin/true: wall time and peak
                 RSS, interleaved rounds (meshrun x R, torchrun, meshrun x R, ...;
                 R = --meshrun-repeats, since a meshrun run costs ~1/50 of one
                 of torchrun's), medians per launcher.
  (b) restart    the same launch with a worker script in which rank 0 fails once
                 (--max-restarts=1), minus the same script never failing; the
                 two alternate (never, once, never, once, ...).
  (c) node loss  3 agents, --nnodes=2:3, one endpoint; SIGKILL one agent and time
                 until the survivors' new workers (world size 2) print their
                 start line (the worker's own timestamp).

Timing: wall = time.perf_counter() from just before the launcher is spawned to
just after os.wait4() returns for it. Memory: ru_maxrss from that os.wait4(),
which on Linux is the peak RSS of the *largest single process* among the
launcher and every descendant it (transitively) reaped - the launcher itself
here, since the workers are /bin/true or sh - not a sum over the tree.

Every process started here runs in its own session (its pid is its process
group); this script makes itself a child subreaper so orphaned workers are
re-parented to it, and kills all of them by pid / process group at the end.
"""

import argparse
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAIL_ONCE = os.path.join(HERE, "fail_once.sh")
NODE_WORKER = os.path.join(HERE, "node_worker.sh")
PR_SET_CHILD_SUBREAPER = 36
START_RE = re.compile(
    r"BENCH_START t=([\d.]+) pid=(\d+) restart=(\d+) world=(\d+) group_rank=(\d+)"
)


def log(*args):
    print("bench-launcher:", *args, file=sys.stderr, flush=True)


def bench_env(python):
    """The environment both launchers get: no PET_* / torchelastic leftovers;
    PYTHON_EXEC is the venv's python3 (the one torch)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "MESHRUN_"))
        and k
        not in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["PYTHON_EXEC"] = python
    return env


class Launchers:
    def __init__(self, args):
        self.meshrun = args.meshrun
        self.rdzvd = args.rdzvd
        self.torchrun = [args.torchrun]

    def standalone(self, kind, max_restarts, script):
        if kind == "meshrun":
            extra = [] if max_restarts is None else [f"--max-restarts={max_restarts}"]
            return [
                self.meshrun,
                "--standalone",
                "--nproc-per-node=4",
                *extra,
                "--no-python",
                *script,
            ]
        extra = [] if max_restarts is None else [f"--max_restarts={max_restarts}"]
        return [
            *self.torchrun,
            "--standalone",
            "--nproc_per_node=4",
            "--monitor_interval=0.1",
            *extra,
            "--no_python",
            *script,
        ]


def shell_join(argv):
    return " ".join(shlex.quote(a) for a in argv)


# ---------------------------------------------------------------- (a), (b)


def timed_run(argv, env, log_path, timeout_s):
    """Runs argv to completion; returns (wall_s, maxrss_kib, cpu_s, exit_code),
    cpu_s = user + system time of the launcher and the descendants it reaped."""
    with open(log_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        # A watchdog, so a hung launcher cannot hang the benchmark.
        timer = threading.Timer(timeout_s, lambda: _killpg(proc.pid))
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = time.perf_counter()
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    _killpg(proc.pid)  # anything the launcher left behind in its group
    return t1 - t0, usage.ru_maxrss, usage.ru_utime + usage.ru_stime, proc.returncode


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path, n=15):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


def run_series(cases, runs, env, tmpdir, timeout_s):
    """cases: list of (label, argv, repeats). One untimed warm-up of each, then
    `runs` rounds; a round runs each case `repeats` times in a row, cases in
    order, so every case sees the same stretch of machine noise."""
    results = {label: [] for label, _, _ in cases}
    for round_no in range(runs + 1):
        for label, argv, repeats in cases:
            log_path = os.path.join(tmpdir, re.sub(r"\W", "_", label) + ".log")
            for _ in range(1 if round_no == 0 else repeats):
                wall, rss, cpu, code = timed_run(argv, env, log_path, timeout_s)
                if code != 0:
                    raise SystemExit(
                        f"bench-launcher: {label} exited {code}:\n"
                        f"  {shell_join(argv)}\n{tail(log_path)}"
                    )
                if round_no > 0:
                    results[label].append((wall, rss, cpu))
        if round_no == 0:
            log("warm-up done")
        else:
            labels = list(dict.fromkeys(label for label, _, _ in cases))
            log(
                f"round {round_no}/{runs}, last of each: "
                + ", ".join(f"{label} {results[label][-1][0]:.3f}s" for label in labels)
            )
    return results


def med(values):
    return statistics.median(values)


# ---------------------------------------------------------------- (c)


class Agent:
    """A launcher process whose stdout and stderr lines are collected with the
    time each was read."""

    def __init__(self, idx, argv, env, events, cond):
        self.idx = idx
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.threads = [
            threading.Thread(target=self._read, args=(s, name), daemon=True)
            for s, name in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))
        ]
        self.events, self.cond = events, cond
        for t in self.threads:
            t.start()

    def _read(self, stream, name):
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self.cond:
                self.events.append((time.time(), self.idx, name, line))
                self.cond.notify_all()


def starts(events, idx=None):
    """Parsed BENCH_START lines: dicts with agent, t, pid, restart, world, group_rank."""
    out = []
    for _, i, stream, line in events:
        m = START_RE.search(line)
        if stream == "out" and m and (idx is None or i == idx):
            out.append(
                dict(
                    agent=i,
                    t=float(m[1]),
                    pid=int(m[2]),
                    restart=int(m[3]),
                    world=int(m[4]),
                    group_rank=int(m[5]),
                )
            )
    return out


def process_alive(pid):
    """Exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, deadline):
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def node_loss_trial(kind, launchers, env, wait_s, trial):
    events, cond = [], threading.Condition()
    agents, daemon, worker_pids = [], None, set()
    run_id = f"bench-node-loss-{os.getpid()}-{kind}-{trial}"
    result = dict(kind=kind, trial=trial)
    try:
        if kind == "meshrun":
            daemon = subprocess.Popen(
                [launchers.rdzvd, "--port", "0"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            line = daemon.stdout.readline().decode()
            m = re.match(r"MESHRUN_RDZVD_ENDPOINT=(\S+)", line)
            if not m:
                raise RuntimeError(f"meshrun-rdzvd printed {line!r}")
            endpoint = m[1]
            argv = [
                launchers.meshrun,
                "--nnodes=2:3",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={run_id}",
                "--max-restarts=3",
                "--no-python",
                NODE_WORKER,
                "600",
            ]
            result["command"] = shell_join(argv)
            agents = [Agent(i, argv, env, events, cond) for i in range(3)]
        else:
            port = free_port()
            argv = [
                *launchers.torchrun,
                "--nnodes=2:3",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                f"--rdzv_id={run_id}",
                "--max_restarts=3",
                "--monitor_interval=0.1",
                "--no_python",
                NODE_WORKER,
                "600",
            ]
            result["command"] = shell_join(argv)
            # The first agent hosts the TCPStore; the others join once it listens.
            agents = [Agent(0, argv, env, events, cond)]
            if not wait_listening(port, time.time() + 60):
                raise RuntimeError("torchrun's first agent never listened on its store port")
            agents += [Agent(i, argv, env, events, cond) for i in (1, 2)]

        # All three workers up in a world of 3.
        deadline = time.time() + 90
        with cond:
            while not all(any(s["world"] == 3 for s in starts(events, i)) for i in range(3)):
                if time.time() > deadline or any(a.proc.poll() is not None for a in agents):
                    raise RuntimeError(
                        "3 workers in a world of 3 never started:\n"
                        + "\n".join(f"  [{i}/{s}] {line}" for _, i, s, line in events[-30:])
                    )
                cond.wait(0.05)
            first = {s["agent"]: s for s in starts(events)}
        worker_pids.update(s["pid"] for s in first.values())
        victim = agents[2]
        victim_worker = first[2]["pid"]
        result["victim_group_rank"] = first[2]["group_rank"]
        time.sleep(0.5)  # let every agent settle into monitoring

        t_kill = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        n_before = len(events)
        deadline = t_kill + wait_s
        restarted, worker_gone_at = {}, None
        while time.time() < deadline:
            with cond:
                for s in starts(events[n_before:]):
                    worker_pids.add(s["pid"])
                    if s["agent"] in (0, 1) and s["world"] == 2 and s["agent"] not in restarted:
                        restarted[s["agent"]] = s
                cond.wait(0.01)
            if worker_gone_at is None and not process_alive(victim_worker):
                worker_gone_at = time.time()
            if len(restarted) == 2 and worker_gone_at is not None:
                break
        t_end = time.time()

        result.update(
            recovered=len(restarted) == 2,
            first_restart_s=min((s["t"] - t_kill for s in restarted.values()), default=None),
            all_restarted_s=(
                max(s["t"] - t_kill for s in restarted.values()) if len(restarted) == 2 else None
            ),
            new_restart_counts=sorted(s["restart"] for s in restarted.values()),
            victim_worker_gone_s=None if worker_gone_at is None else worker_gone_at - t_kill,
            observed_s=t_end - t_kill,
            survivors_alive=[a.proc.poll() is None for a in agents[:2]],
            survivor_workers_alive=[process_alive(first[i]["pid"]) for i in (0, 1)],
            log_after_kill=[
                f"+{t - t_kill:.3f}s [agent{i} {s}] {line}"
                for t, i, s, line in events[n_before:]
                if i in (0, 1)
            ][:40],
        )
        return result
    finally:
        for a in agents:
            _killpg(a.pid)
        for pid in worker_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(5)
            except subprocess.TimeoutExpired:
                _killpg(daemon.pid)
                daemon.wait()
        for a in agents:
            a.proc.wait()
        reap_orphans()


def reap_orphans():
    """Kills and reaps processes re-parented to this subreaper (workers whose
    launcher was killed); they are all descendants of what this script started."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[1] == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
    log("WARNING: some child processes did not exit within 10 s of SIGKILL")


# ---------------------------------------------------------------- report


def fmt_s(x):
    return "-" if x is None else f"{x:.3f} s"


def fmt_ms(x):
    return "-" if x is None else f"{x * 1000:.1f} ms"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--meshrun", required=True)
    p.add_argument("--rdzvd", required=True)
    p.add_argument("--torchrun", required=True, help="torchrun 2 (the venv's bin/torchrun)")
    p.add_argument(
        "--python",
        default=sys.executable,
        help="PYTHON_EXEC for both launchers (the venv's python3)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=9,
        help="timed rounds in (a) and (b); each round runs every case",
    )
    p.add_argument(
        "--meshrun-repeats",
        type=int,
        default=5,
        help="meshrun runs per round in (a) and (b) (they are cheap)",
    )
    p.add_argument("--loss-trials-meshrun", type=int, default=5)
    p.add_argument("--loss-trials-torchrun", type=int, default=1)
    p.add_argument(
        "--loss-wait",
        type=float,
        default=60.0,
        help="seconds to watch the survivors after the kill",
    )
    p.add_argument(
        "--meshrun-wheel",
        help="the pip wheel's meshrun: (a) runs it beside --meshrun, the source build's",
    )
    p.add_argument("--sections", default="launch,restart,loss")
    p.add_argument("--json", help="also write the summary here")
    args = p.parse_args()

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    launchers = Launchers(args)
    tmpdir = tempfile.mkdtemp(prefix="bench-launcher-")
    try:
        run(args, launchers, tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def print_wheel_rows(launch):
    """The pip wheel's meshrun (static, from build-wheel.sh) against the
    source build's, from the same interleaved rounds: within 10% of it."""
    wheel, source = launch["wheel"], launch
    print("\n| (a) launch, medians | wheel's meshrun | source build's | ratio | target | met |")
    print("|---|---|---|---|---|---|")
    for name, key, fmt in (
        ("wall", "median_wall_s", fmt_s),
        ("peak RSS", "median_maxrss_kib", lambda k: f"{k / 1024:.1f} MiB"),
        ("CPU user+sys", "median_cpu_s", fmt_s),
    ):
        w, b = wheel[key], source[key]["meshrun"]
        ratio = w / b if b else float("nan")
        target = "" if key == "median_cpu_s" else "<= 1.10"
        met = "" if not target else ("yes" if ratio <= 1.10 else "NO")
        print(f"| {name} | {fmt(w)} | {fmt(b)} | {ratio:.2f} | {target} | {met} |")


def run(args, launchers, tmpdir):
    sections = set(args.sections.split(","))
    env = bench_env(args.python)
    # Both launchers' temporary files (torchrun leaves a torchelastic_* directory
    # per run; a SIGKILLed agent cannot clean up) go here and are removed at the end.
    env["TMPDIR"] = os.path.join(tmpdir, "tmp")
    os.makedirs(env["TMPDIR"])
    summary = dict(
        runs=args.runs,
        meshrun_repeats=args.meshrun_repeats,
        nproc=os.cpu_count(),
        loss_wait_s=args.loss_wait,
    )
    out = []

    if "launch" in sections:
        log("(a) launch: 4 x /bin/true, standalone")
        cases = [
            ("meshrun", launchers.standalone("meshrun", None, ["/bin/true"]), args.meshrun_repeats),
            ("torchrun", launchers.standalone("torchrun", None, ["/bin/true"]), 1),
        ]
        if args.meshrun_wheel:
            # The wheel's static binary, interleaved with the source build's.
            wheel_argv = [args.meshrun_wheel, *cases[0][1][1:]]
            cases.insert(1, ("wheel", wheel_argv, args.meshrun_repeats))
        r = run_series(cases, args.runs, env, tmpdir, 120)
        col = {k: [list(x) for x in zip(*r[k], strict=False)] for k in ("meshrun", "torchrun")}
        m_wall, t_wall = med(col["meshrun"][0]), med(col["torchrun"][0])
        m_rss, t_rss = med(col["meshrun"][1]), med(col["torchrun"][1])
        m_cpu, t_cpu = med(col["meshrun"][2]), med(col["torchrun"][2])
        summary["launch"] = dict(
            commands={k: shell_join(v) for k, v, _ in cases},
            **{
                k: dict(wall_s=col[k][0], maxrss_kib=col[k][1], cpu_s=col[k][2])
                for k in ("meshrun", "torchrun")
            },
            median_wall_s=dict(meshrun=m_wall, torchrun=t_wall),
            median_maxrss_kib=dict(meshrun=m_rss, torchrun=t_rss),
            median_cpu_s=dict(meshrun=m_cpu, torchrun=t_cpu),
            min_wall_s=dict(meshrun=min(col["meshrun"][0]), torchrun=min(col["torchrun"][0])),
            speedup=t_wall / m_wall,
            rss_fraction=m_rss / t_rss,
        )
        if args.meshrun_wheel:
            wheel = [list(x) for x in zip(*r["wheel"], strict=False)]
            summary["launch"]["wheel"] = dict(
                command=shell_join(wheel_argv),
                wall_s=wheel[0],
                maxrss_kib=wheel[1],
                cpu_s=wheel[2],
                median_wall_s=med(wheel[0]),
                median_maxrss_kib=med(wheel[1]),
                median_cpu_s=med(wheel[2]),
            )
        out.append(
            (
                "(a) launch wall, median",
                fmt_s(m_wall),
                fmt_s(t_wall),
                f"{t_wall / m_wall:.1f}x faster",
                ">= 50x faster",
                t_wall / m_wall >= 50,
            )
        )
        m_min, t_min = min(col["meshrun"][0]), min(col["torchrun"][0])
        out.append(
            (
                "(a) launch wall, fastest run (least disturbed by other load)",
                fmt_s(m_min),
                fmt_s(t_min),
                f"{t_min / m_min:.1f}x faster",
                "",
                None,
            )
        )
        out.append(
            (
                "(a) peak RSS (ru_maxrss), median",
                f"{m_rss / 1024:.1f} MiB",
                f"{t_rss / 1024:.1f} MiB",
                f"{m_rss / t_rss:.3f} of torchrun",
                "< 0.1 of torchrun",
                m_rss / t_rss < 0.1,
            )
        )
        out.append(
            (
                "(a) CPU user+sys of the tree, median",
                fmt_s(m_cpu),
                fmt_s(t_cpu),
                f"{t_cpu / m_cpu:.1f}x less" if m_cpu > 0 else "",
                "",
                None,
            )
        )

    if "restart" in sections:
        log("(b) restart: rank 0 fails once, --max-restarts=1")
        # never/once alternate, so each "once" has a "never" run next to it in
        # time; meshrun's pairs repeat R times per round.
        cases = []
        for kind in ("meshrun", "torchrun"):
            for _ in range(args.meshrun_repeats if kind == "meshrun" else 1):
                for mode in ("never", "once"):
                    cases.append(
                        (f"{kind}/{mode}", launchers.standalone(kind, 1, [FAIL_ONCE, mode]), 1)
                    )
        r = run_series(cases, args.runs, env, tmpdir, 120)
        b = dict(commands={k: shell_join(v) for k, v, _ in cases})
        for kind in ("meshrun", "torchrun"):
            never = [x[0] for x in r[f"{kind}/never"]]
            once = [x[0] for x in r[f"{kind}/once"]]
            b[kind] = dict(
                clean_wall_s=never,
                fail_once_wall_s=once,
                median_clean_s=med(never),
                median_fail_once_s=med(once),
                extra_s=med(once) - med(never),
                paired_extra_s=med([o - n for n, o in zip(never, once, strict=False)]),
            )
        summary["restart"] = b
        me, te = b["meshrun"]["extra_s"], b["torchrun"]["extra_s"]
        out.append(
            (
                "(b) clean run (fail_once.sh never), median",
                fmt_s(b["meshrun"]["median_clean_s"]),
                fmt_s(b["torchrun"]["median_clean_s"]),
                "",
                "",
                None,
            )
        )
        out.append(
            (
                "(b) fail-once run, median",
                fmt_s(b["meshrun"]["median_fail_once_s"]),
                fmt_s(b["torchrun"]["median_fail_once_s"]),
                "",
                "",
                None,
            )
        )
        out.append(
            (
                "(b) extra time of one restart: median(once) - median(never)",
                fmt_ms(me),
                fmt_ms(te),
                f"{te / me:.1f}x less" if me > 0 and te > 0 else "",
                "meshrun < 20 ms",
                "inconclusive (negative: noise)" if me < 0 else me < 0.020,
            )
        )
        mp, tp = b["meshrun"]["paired_extra_s"], b["torchrun"]["paired_extra_s"]
        out.append(
            (
                "(b) same, as the median of (once - the never run beside it)",
                fmt_ms(mp),
                fmt_ms(tp),
                f"{tp / mp:.1f}x less" if mp > 0 and tp > 0 else "",
                "meshrun < 20 ms",
                "inconclusive (negative: noise)" if mp < 0 else mp < 0.020,
            )
        )

    if "loss" in sections:
        loss = {}
        for kind, trials in (
            ("meshrun", args.loss_trials_meshrun),
            ("torchrun", args.loss_trials_torchrun),
        ):
            loss[kind] = []
            for trial in range(trials):
                log(f"(c) node loss: {kind} trial {trial + 1}/{trials}")
                res = node_loss_trial(kind, launchers, env, args.loss_wait, trial)
                log(
                    f"    recovered={res['recovered']} "
                    f"all_restarted={fmt_s(res['all_restarted_s'])}"
                    f" victim_worker_gone={fmt_s(res['victim_worker_gone_s'])}"
                )
                loss[kind].append(res)
        summary["loss"] = loss

        def loss_cell(kind):
            rs = loss[kind]
            if not rs:
                return None, "not run"
            ok = [r["all_restarted_s"] for r in rs if r["recovered"]]
            if len(ok) == len(rs) and ok:
                return med(ok), f"{fmt_ms(med(ok))} (median of {len(ok)})"
            return None, (
                f"no restart in {rs[0]['observed_s']:.0f} s ({len(rs) - len(ok)}/{len(rs)} trials)"
            )

        m_val, m_txt = loss_cell("meshrun")
        t_val, t_txt = loss_cell("torchrun")
        out.append(
            (
                "(c) SIGKILL agent -> both survivors' new workers (world 2) started",
                m_txt,
                t_txt,
                "",
                "< 2 x keep-alive (10 s)",
                m_val is not None and m_val < 10.0,
            )
        )

        def gone_cell(kind):
            g = [r["victim_worker_gone_s"] for r in loss[kind]]
            if not g:
                return "not run"
            if all(x is not None for x in g):
                return f"{fmt_ms(med(g))} (median)"
            return f"still running after {loss[kind][0]['observed_s']:.0f} s (orphan)"

        out.append(
            (
                "(c) killed agent's worker gone after",
                gone_cell("meshrun"),
                gone_cell("torchrun"),
                "",
                "",
                None,
            )
        )

    print("| measurement | meshrun | torchrun | ratio | target | met |")
    print("|---|---|---|---|---|---|")
    for name, m, t, ratio, target, met in out:
        met_txt = met if isinstance(met, str) else "" if met is None else ("yes" if met else "NO")
        print(f"| {name} | {m} | {t} | {ratio} | {target} | {met_txt} |")
    if "launch" in summary and "wheel" in summary["launch"]:
        print_wheel_rows(summary["launch"])

    print("\n```")
    if "launch" in summary:
        print("Raw (a), seconds / KiB, in run order:")
        for kind in ("meshrun", "wheel", "torchrun"):
            if kind not in summary["launch"]:
                continue
            d = summary["launch"][kind]
            print(f"  {kind:8} wall  " + " ".join(f"{w:.3f}" for w in d["wall_s"]))
            print(f"  {kind:8} rss   " + " ".join(str(k) for k in d["maxrss_kib"]))
            print(f"  {kind:8} cpu   " + " ".join(f"{c:.3f}" for c in d["cpu_s"]))
    if "restart" in summary:
        print("\nRaw (b), seconds, in run order:")
        for kind in ("meshrun", "torchrun"):
            d = summary["restart"][kind]
            print(f"  {kind:8} never " + " ".join(f"{w:.3f}" for w in d["clean_wall_s"]))
            print(f"  {kind:8} once  " + " ".join(f"{w:.3f}" for w in d["fail_once_wall_s"]))
    if "loss" in summary:
        print("\nRaw (c), per trial (times from the SIGKILL):")
        for kind in ("meshrun", "torchrun"):
            for r in summary["loss"][kind]:
                print(
                    f"  {kind:8} trial {r['trial']}: victim group rank {r['victim_group_rank']}, "
                    f"first survivor restarted {fmt_s(r['first_restart_s'])}, "
                    f"both {fmt_s(r['all_restarted_s'])}, new restart counts "
                    f"{r['new_restart_counts']}, killed agent's worker gone "
                    f"{fmt_s(r['victim_worker_gone_s'])}, watched {r['observed_s']:.1f} s, "
                    f"survivor agents alive {r['survivors_alive']}, "
                    f"their first workers alive {r['survivor_workers_alive']}"
                )
        for kind in ("meshrun", "torchrun"):
            if not summary["loss"][kind]:
                continue
            r = summary["loss"][kind][-1]
            print(f"\n  {kind} survivors' output after the kill (last trial, first 40 lines):")
            print(f"    command: {r['command']}")
            for line in r["log_after_kill"] or ["(nothing)"]:
                print("    " + line)

    print("```")
    print("\nSUMMARY_JSON " + json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()

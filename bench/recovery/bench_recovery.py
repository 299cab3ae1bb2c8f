#!/usr/bin/env python3
"""Recovery from a worker failure: meshrun's fault-tolerant replicas vs
meshrun's default full restart from a checkpoint vs torchrun 2 with a
torch.distributed.checkpoint (DCP) reload (issue 18).

Run by `scripts/bench-recovery.sh`. Three setups, all world 4 (dp 4, one
rank a replica), the same GPT (tests/parity/layouts.py's SIZES[--sizes])
and global batch, SGD without momentum, gloo on CPU, OMP_NUM_THREADS=1:

  ft       meshrun --standalone --nproc-per-node=4 --no-python --restart-scope=replica
           --max-restarts=K train_example --model gpt ... --dp 4 --fault-tolerant
  restart  meshrun --standalone --nproc-per-node=4 --no-python --max-restarts=K
           train_example ... --dp 4 --checkpoint-dir D --checkpoint-every C
           (meshrun's default: every worker restarts, resuming from the latest checkpoint)
  torch    torchrun --standalone --nproc-per-node=4 --max-restarts=K
           bench/recovery/torch_ddp_recovery.py --checkpoint-dir D --checkpoint-every C
           (DDP; dcp.save every C steps, dcp.load of the latest on start)

Two experiments, each launching every setup once a round (who goes first
rotates from round to round):

  one    --steps S steps with one failure: the last rank SIGKILLs itself at the
         start of step --kill-at-step F (default C + C/2 + 1: mid-interval).
  every  --every-steps S2 steps with a failure at the start of every
         --kill-every N-th step (train_example's KillStep: each replica in turn).

Every line the launcher writes (the workers' come through its pipes) is
timestamped with time.monotonic() as this driver reads it; the workers print
`step S loss X` (one reporting rank), `rank R SIGKILLs itself at step F
(start)`, `layout ...` when a (re)started world is set up (rank 0), `resumed
from the checkpoint after step N` (N steps done, training goes on with step
N), and in FT mode `step S: replicas 0,1,3`, `step S discarded: WHY` and
`replica R member M healed from replica Q at step S`. Definitions, per
failure (kill line at t_kill, step F):

- step time: the median interval between consecutive `step s` / `step s+1`
  lines of the launch, leaving out the intervals that end inside a recovery
  (t_kill, t_full] and, for the restart setups, those holding a checkpoint
  write (the line of a step s with s % C == 0 ends them). The checkpoint cost
  is the median of those minus the step time.
- steps lost: the steps whose work was thrown away. FT: the steps discarded
  after the kill (`discarded` lines; or, when the reporter that would have
  said so was the replica that died, a quorum for step F formed again
  without it). Restart: the interrupted step F
  plus every step trained again after the resume (a `step s` line whose s was
  printed before): F - N + 1 after resuming from N.
- seconds lost: t(the first `step F loss` line after the kill) - t_kill - one
  step time: how much later than without the failure training got past F.
- back to full strength: t_full - t_kill, t_full the first `step s loss` line
  of a step trained by every replica: FT, the first step after a `step s:
  replicas 0,1,2,3` line with s > F; restart, the first step line after the
  new world's `layout` line.
- breakdown: the launcher saw it (meshrun's `worker failed; restarting`,
  torchrun's `failed (exitcode: -9)`); restart, kill -> `torch imported`
  (torchrun: the agent saw the failure, stopped the others and started
  Python workers that imported
  torch) -> `layout` (processes started, process group and model set up) ->
  `resumed` (checkpoint read) -> first step; FT, kill ->
  the survivors' `discarded` line (failure detected), -> the new incarnation's
  start line, -> `healed` (state copied).

For --kill-every, the training's wall time is t(last step line) - t(first
step line), launcher and first world start-up excluded, every failure and
checkpoint included; efficiency = (S2 - 1) x the launch's own step time /
that wall time (torchft's measure: time a failure-free run would need over
the time taken); throughput = (S2 - 1) / wall time in steps/s (comparable
across setups: FT steps are slower, as each holds a quorum and a commit
vote). FT steps trained while a replica was missing count as steps (on 3/4
of the batch), and are counted in their own column.

A worker that dies without a kill line of its own (meshrun's `rank R failed
(WHY)` with no kill before it; seen: a fault-tolerant survivor killed by
SIGPIPE as a peer's socket closed) is listed under "Workers that died without
being killed", and its launch may hold fewer injected failures than planned
(its replica restarts as a new incarnation, whose planned failure is later).

Stdlib only (torch runs in the workers); progress on stderr, Markdown on
stdout. Exit 0 when every launch finished, 1 otherwise, 2 for bad flags.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "parity"))
import layouts  # noqa: E402

SETUPS = ("ft", "restart", "torch", "ftpy", "torchft")
NAMES = {
    "ft": "meshrun FT replicas",
    "restart": "meshrun full restart",
    "torch": "torchrun 2 + DCP",
    "ftpy": "meshrun.ft (Python)",
    "torchft": "torchft 0.2.0",
}
# The restart-free setups: the same lines, the same analysis.
FT_SETUPS = ("ft", "ftpy", "torchft")
WORLD = 4

STEP_RE = re.compile(r"\bstep (\d+) loss (\S+)\s*$")
KILL_RE = re.compile(r"\brank (\d+) SIGKILLs itself at step (\d+)")
# "replicas 0,1,3" (meshrun, which names them), "3 replicas" (torchft's reporter).
REPLICAS_RE = re.compile(r"\bstep (\d+): (?:replicas ([\d,]+)|(\d+) replicas)\s*$")
DISCARD_RE = re.compile(r"\bstep (\d+) discarded: ")
RESUMED_RE = re.compile(r"\bresumed from the checkpoint after step (\d+)")
HEALED_RE = re.compile(r"\breplica \d+ member \d+ healed from replica \S+ at step \d+")
INCARNATION_RE = re.compile(r"\brank \d+ pid \d+: replica \d+ member \d+ incarnation [1-9]")
LAYOUT_RE = re.compile(r"(^|\]:? ?)layout ")
TORCH_IMPORTED_RE = re.compile(r"^torch imported$")
# The launcher's own word that it saw the failure: meshrun's warning,
# torchrun's error line.
# meshrun's word that a worker died (fault-tolerant scope: one line each).
DEATH_RE = re.compile(r"\[meshrun\] \[warning\] rank (\d+) failed \(([^)]*)\)")
LAUNCHER_RE = re.compile(
    r"\[meshrun\] \[warning\] worker failed; restarting|"
    r"\bfailed \(exitcode: -?\d+\) local_rank: \d+"
)


class BadFlags(argparse.ArgumentParser):
    """One line and exit 2 for bad flags."""

    def error(self, message):
        print(f"bench-recovery: {message}", file=sys.stderr)
        sys.exit(2)


def log(*args):
    print("bench-recovery:", *args, file=sys.stderr, flush=True)


def bench_env(threads, setup, meshrun=None):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "MESHRUN_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    if setup == "ftpy" and meshrun:
        # This checkout's meshrun package, with the stubs of meshrun's build.
        build = os.path.dirname(os.path.dirname(os.path.abspath(meshrun)))
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(HERE, "..", "..", "python"), os.path.join(build, "python")]
        )
    if setup == "torch":
        # torchrun 2.15 shares its rendezvous TCPStore with the workers by
        # default, and the keys of gloo's connectFullMesh are the same in every
        # attempt: a restarted world reads the dead attempt's addresses and
        # fails ("Connection refused"; pytorch issue 135712). The opt-out has
        # rank 0 host a fresh store per attempt, as before torch 2.5.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


# --- One launch. -----------------------------------------------------------------


def descendants(root):
    """The pids below `root` now (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def end_group(pgid, grace):
    """SIGTERM to the launcher's process group (it stops its workers), then
    SIGKILL after `grace` s to the group and to each process that was below
    the launcher (workers in sessions of their own: torchrun's; meshrun's
    also die with it, PR_SET_PDEATHSIG)."""
    below = descendants(pgid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
    for pid in below:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def launch(cmd, env, timeout, log_path):
    """Runs `cmd` in its own session, timestamping each output line as it is
    read. Returns (exit code or None on timeout, [(monotonic s, line)])."""
    lines = []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )

    def read():
        for raw in iter(proc.stdout.readline, b""):
            lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc.pid, 10)
        proc.wait(timeout=30)
        rc = None
    except BaseException:  # ^C: the workers go too
        end_group(proc.pid, 10)
        raise
    finally:
        # Whatever the launcher left in its group.
        end_group(proc.pid, 0)
    reader.join(timeout=10)
    proc.stdout.close()
    with open(log_path, "w") as f:
        t0 = lines[0][0] if lines else 0
        f.writelines(f"{t - t0:9.3f} {line}\n" for t, line in lines)
    return rc, list(lines)


# --- What a launch's lines say. ---------------------------------------------------


class Failure:
    """One failure's numbers (seconds; None when the run never got there)."""

    def __init__(self, step, t_kill):
        self.step, self.t_kill = step, t_kill
        self.t_full = self.t_step_again = None
        self.discarded = self.retrained = 0
        self.redone = set()  # steps below `step` trained again after the kill
        self.marks = {}  # breakdown: name -> seconds after the kill

    @property
    def steps_lost(self):
        return self.discarded + self.retrained


class Analysis:
    """The numbers of one launch, from its timestamped lines."""

    def __init__(self, setup, lines, checkpoint_every):
        self.setup = setup
        ft = setup in FT_SETUPS
        self.failures = []
        # Workers that died without a kill line of theirs: (rank, why, s after
        # the last kill).
        self.unplanned = []
        planned = []  # ranks whose kill line has not met its death line yet
        steps = []  # (t, step, trained by every replica?)
        participants = WORLD
        pending = []  # failures not yet back to full strength, oldest first
        all_in_quorum = False  # FT: a quorum of every replica since the last kill
        restarted = False  # restart: the new world's `layout` line since the last kill

        def mark(name, t):
            for f in pending:
                f.marks.setdefault(name, t - f.t_kill)

        for t, line in lines:
            latest = self.failures[-1] if self.failures else None
            m = KILL_RE.search(line)
            if m:
                planned.append(int(m.group(1)))
                failure = Failure(int(m.group(2)), t)
                self.failures.append(failure)
                pending.append(failure)
                all_in_quorum = restarted = False
                continue
            m = REPLICAS_RE.search(line)
            if m:
                participants = len(m.group(2).split(",")) if m.group(2) else int(m.group(3))
                if participants == WORLD and pending and int(m.group(1)) > latest.step:
                    all_in_quorum = True
                    mark("all replicas in quorum", t)
                elif participants < WORLD and pending:
                    mark("quorum without it", t)
                    # The interrupted step's quorum formed again: its first try
                    # was discarded (the reporter that would have said so may
                    # be the replica that died).
                    if int(m.group(1)) == latest.step and not latest.discarded:
                        latest.discarded = 1
                continue
            m = DEATH_RE.search(line)
            if m:
                rank, why = int(m.group(1)), m.group(2)
                if why == "SIGKILL" and rank in planned:
                    planned.remove(rank)
                else:
                    self.unplanned.append((rank, why, t - latest.t_kill if latest else None))
                # (no continue: it is also the launcher's word below)
            if pending and LAUNCHER_RE.search(line):
                mark("launcher saw it", t)
                continue
            if latest and DISCARD_RE.search(line):
                latest.discarded += 1
                mark("failure detected (discard)", t)
                continue
            if ft and pending:
                if INCARNATION_RE.search(line):
                    mark("new incarnation up", t)
                    continue
                if HEALED_RE.search(line):
                    mark("healed", t)
                    continue
            elif pending:
                if TORCH_IMPORTED_RE.search(line):
                    mark("torch imported", t)
                    continue
                if LAYOUT_RE.search(line):
                    restarted = True
                    mark("world set up (layout)", t)
                    continue
                if RESUMED_RE.search(line):
                    mark("checkpoint read (resumed)", t)
                    continue
            m = STEP_RE.search(line)
            if not m:
                continue
            step = int(m.group(1))
            full = participants == WORLD
            # A step below the failure's, trained again after it, was lost,
            # whether or not its first run got to print its line: under load
            # the printing rank may be stopped between finishing a step and
            # saying so (CI saw 3 of a restart's 4 lost steps that way).
            if latest and step < latest.step and step not in latest.redone:
                latest.redone.add(step)
                latest.retrained += 1
            for f in self.failures:
                if step == f.step and f.t_step_again is None:
                    f.t_step_again = t
            if pending and (all_in_quorum if ft else restarted):
                mark("first full step", t)
                for f in pending:
                    f.t_full = t
                pending = []
            steps.append((t, step, full))
        if not ft:
            for f in self.failures:
                f.retrained += 1  # the interrupted step: started, never finished
        self.steps = steps
        self.partial_steps = sum(1 for _, _, full in steps if not full)

        # The failure-free step time, and what a checkpoint write adds.
        windows = [
            (f.t_kill, f.t_full if f.t_full is not None else float("inf")) for f in self.failures
        ]
        plain, saving = [], []
        for (t0, s0, _), (t1, s1, _) in zip(steps, steps[1:], strict=False):
            if s1 != s0 + 1 or any(a < t1 <= b for a, b in windows):
                continue
            if checkpoint_every and not ft and s1 % checkpoint_every == 0:
                saving.append(t1 - t0)
            else:
                plain.append(t1 - t0)
        self.step_s = statistics.median(plain) if plain else None
        self.checkpoint_s = (
            statistics.median(saving) - self.step_s if saving and self.step_s is not None else None
        )
        for f in self.failures:
            f.back_s = f.t_full - f.t_kill if f.t_full is not None else None
            f.lost_s = (
                f.t_step_again - f.t_kill - self.step_s
                if f.t_step_again is not None and self.step_s is not None
                else None
            )
        self.wall_s = steps[-1][0] - steps[0][0] if len(steps) > 1 else None

    def efficiency(self, total_steps):
        if not self.wall_s or self.step_s is None:
            return None
        return (total_steps - 1) * self.step_s / self.wall_s


# --- The benchmark. ---------------------------------------------------------------


def model_flags():
    c = layouts.GPT
    flags = ["--model", "gpt", "--batch", str(layouts.BATCH), "--lr", str(layouts.LR)]
    for key in ("vocab", "context", "dim", "heads", "layers"):
        flags += [f"--{key}", str(c[key])]
    return flags


def parameter_bytes():
    """fp32 bytes of the GPT's parameters (worker_lib/models/gpt.h)."""
    c = layouts.GPT
    d, v = c["dim"], c["vocab"]
    # Two layer norms, q k v o without biases, fc1 (d -> 4d) and fc2 with.
    block = 2 * 2 * d + 4 * d * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return 4 * (v * d + c["context"] * d + c["layers"] * block + 2 * d + d * v)


def command(args, setup, steps, kill, checkpoint_dir, restarts):
    """The launch of `setup`; kill = ("at", F) or ("every", N)."""
    kill_flags = (
        ["--kill-at-step", str(kill[1])] if kill[0] == "at" else ["--kill-every", str(kill[1])]
    )
    # The Python programs' shared flags (train_example's are model_flags()).
    python_flags = ["--sizes", args.sizes, "--steps", str(steps), "--lr", str(layouts.LR)]
    if setup == "torch":
        return [
            args.torchrun,
            "--standalone",
            f"--nproc-per-node={WORLD}",
            f"--max-restarts={restarts}",
            os.path.join(HERE, "torch_ddp_recovery.py"),
            *python_flags,
            "--checkpoint-dir",
            checkpoint_dir,
            "--checkpoint-every",
            str(args.checkpoint_every),
            *kill_flags,
        ]
    if setup in PYTHON_SETUPS:
        script = [
            os.path.join(HERE, "ft_python_recovery.py"),
            "--system",
            "meshrun" if setup == "ftpy" else "torchft",
            *python_flags,
            *kill_flags,
        ]
        if setup == "torchft":
            return [
                sys.executable,
                os.path.join(HERE, "torchft_launch.py"),
                f"--groups={WORLD}",
                f"--max-restarts={restarts}",
                f"--torchrun={args.torchrun}",
                f"--lighthouse={args.lighthouse}",
                "--",
                *script,
            ]
        return [
            args.meshrun,
            "--standalone",
            f"--nproc-per-node={WORLD}",
            "--restart-scope=replica",
            f"--max-restarts={restarts}",
            "--no-python",
            sys.executable,
            "-u",
            *script,
        ]
    cmd = [args.meshrun, "--standalone", f"--nproc-per-node={WORLD}", "--no-python"]
    if setup == "ft":
        cmd += ["--restart-scope=replica"]
    cmd += [
        f"--max-restarts={restarts}",
        args.train_example,
        *model_flags(),
        "--dp",
        str(WORLD),
        "--steps",
        str(steps),
    ]
    if setup == "ft":
        cmd += ["--fault-tolerant"]
    else:
        cmd += [
            "--checkpoint-dir",
            checkpoint_dir,
            "--checkpoint-every",
            str(args.checkpoint_every),
        ]
    return cmd + kill_flags


PYTHON_SETUPS = ("ftpy", "torchft")


def args_for(args, setup):
    """The run's settings for `setup`: the Python pair trains longer runs
    (--python-*), as its interpreters take seconds to start again."""
    if setup not in PYTHON_SETUPS:
        return args
    view = argparse.Namespace(**vars(args))
    view.steps, view.every_steps = args.python_steps, args.python_every_steps
    view.kill_every = args.python_kill_every
    return view


def plan(args, experiment):
    """(steps, kill flag, failures) of an `experiment` launch."""
    if experiment == "one":
        return args.steps, ("at", args.kill_at_step), 1
    return args.every_steps, ("every", args.kill_every), (args.every_steps - 1) // args.kill_every


def run_one(args, work, setup, experiment, round_index, raw):
    args = args_for(args, setup)
    steps, kill, expected = plan(args, experiment)
    tag = f"r{round_index}-{experiment}-{setup}"
    checkpoint_dir = os.path.join(work, tag + "-ckpt")
    cmd = command(args, setup, steps, kill, checkpoint_dir, expected + 1)
    t0 = time.monotonic()
    rc, lines = launch(
        cmd,
        bench_env(args.threads, setup, args.meshrun),
        args.timeout,
        os.path.join(work, tag + ".log"),
    )
    took = time.monotonic() - t0
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    raw.append(f"$ {' '.join(cmd)}   # exit {rc}, {took:.1f} s")
    result = Analysis(setup, lines, args.checkpoint_every)
    result.tag = tag
    last = result.steps[-1][1] if result.steps else None
    problem = None
    if rc != 0:
        problem = "timed out" if rc is None else f"exit {rc}"
    elif last != steps - 1:
        problem = f"last step line {last}, not {steps - 1}"
    elif len(result.failures) != expected and not (
        result.unplanned and len(result.failures) < expected
    ):
        # (A worker that died unplanned restarts as a new incarnation, whose
        # planned failure comes later: fewer of them in the run.)
        problem = f"{len(result.failures)} failures, not {expected}"
    elif any(f.lost_s is None for f in result.failures):
        problem = "a failure without recovery lines"
    elif experiment == "one" and result.failures[0].back_s is None and not args.check:
        # (With --kill-every a failure may strike before the last one's
        # replica is back, or too close to the end for its own to be. With
        # --check, the smoke test's verdict, timing is no verdict: a loaded
        # machine may restart the replica after the last step.)
        problem = f"not back at full strength by the last step ({steps - 1}): more --steps"
    if problem:
        tail = " | ".join(line for _, line in lines[-4:])
        raise RuntimeError(f"{tag}: {problem} (log {os.path.join(work, tag + '.log')}): {tail}")
    summary = (
        f"{tag}: step {result.step_s * 1e3:.1f} ms, "
        + ", ".join(
            f"kill@{f.step}: lost {f.steps_lost} steps / {f.lost_s:.2f} s, "
            + (
                f"full after {f.back_s:.2f} s"
                if f.back_s is not None
                else "not back before the end"
            )
            for f in result.failures[:3]
        )
        + (f" (+{len(result.failures) - 3} more)" if len(result.failures) > 3 else "")
        + (
            f", wall {result.wall_s:.1f} s, efficiency {result.efficiency(steps):.3f}"
            if experiment == "every"
            else ""
        )
    )
    if result.unplanned:
        summary += ", UNPLANNED: " + ", ".join(
            f"rank {rank} {why}" + (f" {dt:.2f} s after the kill" if dt is not None else "")
            for rank, why, dt in result.unplanned
        )
    raw.append(summary)
    for f in result.failures[:1]:
        raw.append(
            f"  {tag} breakdown: " + ", ".join(f"{k} +{v:.2f} s" for k, v in f.marks.items())
        )
    log(summary)
    return result


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b, fmt=".3g"):
    if a is None or b is None or b == 0:
        return "n/a"
    return format(a / b, fmt)


def ratio_rows(rows, keys):
    """The table's meshrun / peer rows: a cell per key of `keys` (None: left
    empty), each the ratio of the two setups' values: the C++ setups against
    torchrun, meshrun.ft against torchft."""
    pairs = [("ft", "torch"), ("restart", "torch"), ("ftpy", "torchft")]
    for ours, peer in pairs:
        if ours in rows and peer in rows:
            cells = ["" if k is None else ratio(rows[ours][k], rows[peer][k]) for k in keys]
            print(f"| {NAMES[ours]} / {NAMES[peer]} | " + " | ".join(cells) + " |")


def measured(setups, results, experiment, columns):
    """(setup, its runs) for each setup with runs of `experiment`; the others
    get a FAILED row of the table's `columns`."""
    for setup in setups:
        runs = results[(experiment, setup)]
        if runs:
            yield setup, runs
        else:
            print(f"| {NAMES[setup]} | FAILED |" + " |" * (columns - 2))


def report_one(args, setups, results):
    """The one-failure table (Markdown on stdout)."""
    mb = parameter_bytes() / 2**20
    print(
        f"### One failure: the last rank SIGKILLed at the start of step "
        f"F = {args.kill_at_step} of {args.steps}"
    )
    print()
    print(
        "| setup | step ms | checkpoint write ms | steps lost | seconds lost "
        "| back to full strength s | breakdown (s after the kill, medians) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    rows = {}
    for setup, runs in measured(setups, results, "one", columns=7):
        fs = [run.failures[0] for run in runs]
        row = dict(
            step=med(r.step_s for r in runs),
            ckpt=med(r.checkpoint_s for r in runs),
            lost=med(f.steps_lost for f in fs),
            lost_s=med(f.lost_s for f in fs),
            back=med(f.back_s for f in fs),
        )
        rows[setup] = row
        marks = {}
        for f in fs:
            for k, v in f.marks.items():
                marks.setdefault(k, []).append(v)
        breakdown = ", ".join(
            f"{k} {med(v):.2f}" for k, v in sorted(marks.items(), key=lambda kv: med(kv[1]))
        )
        if setup in FT_SETUPS:
            ckpt = "-"
        elif row["ckpt"] is None:
            ckpt = "n/a"
        else:  # a write cheaper than the steps' noise can come out negative
            ckpt = (
                f"{row['ckpt'] * 1e3:.1f}" if row["ckpt"] >= 0 else f"~0 ({row['ckpt'] * 1e3:.1f})"
            )
        back = "n/a (after the last step)" if row["back"] is None else f"{row['back']:.2f}"
        print(
            f"| {NAMES[setup]} | {row['step'] * 1e3:.1f} | {ckpt} | {row['lost']:g} "
            f"| {row['lost_s']:.2f} | {back} | {breakdown} |"
        )
    ratio_rows(rows, ["step", None, "lost", "lost_s", "back", None])
    print()
    if "ft" in rows:
        ft = rows["ft"]
        print(
            f"Goal (FT): survivors lose at most one step: {ft['lost']:g} "
            f"({'MET' if ft['lost'] <= 1 else 'NOT MET'}); full strength within 2 s plus "
            f"the weight copy ({mb:.1f} MiB, milliseconds at loopback speed): "
            + (
                "not back before the last step (NOT MET)"
                if ft["back"] is None
                else f"{ft['back']:.2f} s ({'MET' if ft['back'] <= 2.0 else 'NOT MET'})."
            )
        )
        print()


def report_every(args, setups, results):
    """The failure-every-N-steps table (Markdown on stdout)."""
    failures = plan(args, "every")[2]
    print(
        f"### A failure every N = {args.kill_every} steps: {failures} failures in "
        f"{args.every_steps} steps"
    )
    print()
    print(
        "| setup | step ms | failures (+ unplanned) | training wall s | steps lost "
        "| steps without every replica | efficiency | throughput steps/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for setup, runs in measured(setups, results, "every", columns=8):
        row = dict(
            step=med(r.step_s for r in runs),
            wall=med(r.wall_s for r in runs),
            failures=med(len(r.failures) for r in runs),
            unplanned=med(len(r.unplanned) for r in runs),
            lost=med(sum(f.steps_lost for f in r.failures) for r in runs),
            partial=med(r.partial_steps for r in runs),
            eff=med(r.efficiency(args.every_steps) for r in runs),
            tput=med((args.every_steps - 1) / r.wall_s for r in runs),
        )
        rows[setup] = row
        print(
            f"| {NAMES[setup]} | {row['step'] * 1e3:.1f} "
            f"| {row['failures']:g} (+ {row['unplanned']:g}) | {row['wall']:.1f} "
            f"| {row['lost']:g} | {row['partial']:g} | {row['eff']:.3f} "
            f"| {row['tput']:.2f} |"
        )
    ratio_rows(rows, ["step", None, "wall", "lost", None, "eff", "tput"])
    print()


def report_unplanned(results):
    """The workers that died without a kill line of their own."""
    deaths = [
        f"- {run.tag}: rank {rank} died ({why})"
        + (f", {dt:.2f} s after the last kill line" if dt is not None else "")
        for runs in results.values()
        for run in runs
        for rank, why, dt in run.unplanned
    ]
    print("### Workers that died without being killed")
    print()
    print("\n".join(deaths) if deaths else "None.")
    print()


def main():
    parser = BadFlags(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--meshrun", help="build/bin/meshrun (setups ft, restart)")
    parser.add_argument("--train-example", help="build/bin/train_example (setups ft, restart)")
    parser.add_argument("--torchrun", help="the venv's torchrun (setups torch, torchft)")
    parser.add_argument(
        "--lighthouse",
        help="the venv's torchft_lighthouse (setup torchft; default beside torchrun)",
    )
    parser.add_argument("--setups", default=",".join(SETUPS), help="of " + ",".join(SETUPS))
    parser.add_argument("--experiments", default="one,every", help="of one,every")
    parser.add_argument(
        "--sizes",
        default="bench",
        choices=list(layouts.SIZES),
        help="the GPT and batch (tests/parity/layouts.py SIZES)",
    )
    parser.add_argument("--steps", type=int, default=30, help="steps of a one-failure run")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        help="C: the restart setups' checkpoint interval",
    )
    parser.add_argument(
        "--kill-at-step", type=int, help="F: the one failure's step (default C + C/2 + 1)"
    )
    parser.add_argument("--every-steps", type=int, default=100, help="steps of a --kill-every run")
    parser.add_argument(
        "--kill-every",
        type=int,
        default=33,
        help="N: a failure every N steps (best not a multiple of C, so "
        "failures fall at varied points of the checkpoint interval)",
    )
    parser.add_argument(
        "--python-steps", type=int, default=100, help="steps of a one-failure run of ftpy, torchft"
    )
    parser.add_argument(
        "--python-every-steps", type=int, default=200, help="steps of their --kill-every run"
    )
    parser.add_argument(
        "--python-kill-every", type=int, default=50, help="their N (a Python restart takes seconds)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: parity sizes, 1 round, 150 + 60 steps, C 4, "
        "F 7, N 23 (150: a loaded 2-core machine takes 3 s or more "
        "to start the failed replica again)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless every one-failure run lost the steps its design "
        "says (FT at most 1; restart F - N + 1 from the checkpoint after "
        "N steps): the smoke test's verdict, timing aside",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the flags, print the launches' commands, run nothing",
    )
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a launch")
    parser.add_argument("--raw", help="file for each launch's command and numbers")
    parser.add_argument("--work", help="keep the launches' logs here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds, args.steps, args.every_steps = "parity", 1, 150, 60
        args.checkpoint_every, args.kill_every = 4, 23
        args.python_steps, args.python_every_steps, args.python_kill_every = 80, 200, 50
    setups = args.setups.split(",")
    experiments = args.experiments.split(",")
    if not setups or not set(setups) <= set(SETUPS):
        parser.error(f"--setups takes some of {','.join(SETUPS)}, not {args.setups}")
    if not experiments or not set(experiments) <= {"one", "every"}:
        parser.error(f"--experiments takes some of one,every, not {args.experiments}")
    if args.checkpoint_every < 1 or args.rounds < 1 or args.threads < 1 or args.timeout <= 0:
        parser.error("--checkpoint-every, --rounds, --threads and --timeout must be positive")
    if args.kill_at_step is None:
        args.kill_at_step = args.checkpoint_every + args.checkpoint_every // 2 + 1
    if not 0 < args.kill_at_step < args.steps - 1:
        parser.error(
            f"--kill-at-step {args.kill_at_step} must lie within 1..{args.steps - 2} "
            f"(--steps {args.steps})"
        )
    if set(setups) & set(PYTHON_SETUPS) and not (
        0 < args.kill_at_step < args.python_steps - 1
        and 1 < args.python_kill_every < args.python_every_steps - 1
    ):
        parser.error(
            "--kill-at-step must lie within 1..--python-steps - 2 and --python-kill-every "
            "within 2..--python-every-steps - 2"
        )
    if not 1 < args.kill_every < args.every_steps - 1:
        parser.error(
            f"--kill-every {args.kill_every} must lie within 2..{args.every_steps - 2} "
            f"(--every-steps {args.every_steps})"
        )
    if args.torchrun and not args.lighthouse:
        args.lighthouse = os.path.join(os.path.dirname(args.torchrun), "torchft_lighthouse")
    needed = [(args.torchrun, "--torchrun")] if set(setups) & {"torch", "torchft"} else []
    if "torchft" in setups:
        needed += [(args.lighthouse, "--lighthouse")]
    if set(setups) & {"ft", "restart", "ftpy"}:
        needed += [(args.meshrun, "--meshrun")]
    if set(setups) & {"ft", "restart"}:
        needed += [(args.train_example, "--train-example")]
    for path, flag in needed:
        if not path:
            parser.error(f"{flag} is needed for --setups {args.setups}")
        if not os.access(path, os.X_OK):
            parser.error(f"{flag} {path}: not an executable")
    layouts.use_sizes(args.sizes)
    if args.dry_run:
        for experiment in experiments:
            for setup in setups:
                view = args_for(args, setup)
                steps, kill, failures = plan(view, experiment)
                print(" ".join(command(view, setup, steps, kill, "CHECKPOINT_DIR", failures + 1)))
        return 0

    work = args.work or tempfile.mkdtemp(prefix="meshrun-bench-recovery-")
    os.makedirs(work, exist_ok=True)
    results = {(e, s): [] for e in experiments for s in setups}
    failed, raw = [], []
    try:
        for r in range(args.rounds):
            order = setups[r % len(setups) :] + setups[: r % len(setups)]
            for experiment in experiments:
                for setup in order:
                    try:
                        results[(experiment, setup)].append(
                            run_one(args, work, setup, experiment, r + 1, raw)
                        )
                    except RuntimeError as e:
                        failed.append(str(e))
                        log(f"FAILED {e}")
    finally:
        if args.raw:
            with open(args.raw, "w") as f:
                f.write("\n".join(raw) + "\n")

    c = layouts.GPT
    mb = parameter_bytes() / 2**20
    print(
        f'Model (layouts.SIZES["{args.sizes}"]): train_example\'s torch::nn GPT, vocab '
        f"{c['vocab']}, dim {c['dim']}, {c['heads']} heads, {c['layers']} blocks, "
        f"context {c['context']}: {mb:.1f} MiB of fp32 parameters. Global "
        f"batch {layouts.BATCH} over world {WORLD} (dp {WORLD}), SGD lr {layouts.LR}, gloo, "
        f"OMP_NUM_THREADS={args.threads}. Checkpoint every C = {args.checkpoint_every} "
        f"steps (restart setups). {args.rounds} round(s), medians over rounds."
    )
    print()
    # The C++ setups against torchrun, then meshrun.ft against torchft.
    for group in (
        [s for s in setups if s not in PYTHON_SETUPS],
        [s for s in setups if s in PYTHON_SETUPS],
    ):
        if not group:
            continue
        view = args_for(args, group[0])
        if group[0] in PYTHON_SETUPS:
            print(
                "## Python programs: meshrun.ft against torchft 0.2.0 (the same GPT in "
                "Python, worker_lib/models/gpt.py; bench/recovery/ft_python_recovery.py)"
            )
            print()
        if "one" in experiments:
            report_one(view, group, results)
        if "every" in experiments:
            report_every(view, group, results)
    report_unplanned(results)
    if args.check and "one" in experiments:
        # The checkpoint the restart setups resume from: the last one taken
        # before the failure (after N steps, N a multiple of C, N > 0).
        resumed = args.kill_at_step // args.checkpoint_every * args.checkpoint_every
        want = {"ft": (0, 1), "restart": (args.kill_at_step - resumed + 1,) * 2}
        want["torch"] = want["restart"]
        want["ftpy"] = want["ft"]
        want["torchft"] = (0, args.python_steps)  # torchft's design: measured, not held to ours
        for setup in setups:
            for run in results[("one", setup)]:
                lost = run.failures[0].steps_lost
                low, high = want[setup]
                if not low <= lost <= high:
                    failed.append(f"{setup}: lost {lost} steps, expected {low}..{high}")
    if failed:
        print("### Failed launches")
        print()
        print("\n".join(f"- {f}" for f in failed))
        log(f"logs kept in {work}")
    elif not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

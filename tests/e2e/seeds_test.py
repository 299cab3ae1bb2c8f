"""The seeds' programs (examples/seeds/) under torchrun 2 and under meshrun.

Each case runs one program with the seed's own command line, once under the
venv's torchrun and once under meshrun (same flags, same environment, one or
two launchers as the seed has nodes), and requires:
  - the same exit code, and the one the case pins (what torchrun 2 gives here);
  - the same worker output: every line the workers printed, stdout and
    stderr, with the launchers' own lines left out and pids, times and
    addresses normalized. A program that succeeds must print the same lines
    the same number of times. One that fails stops its other workers at a
    moment neither launcher controls, and torchrun's workers' tracebacks
    interleave mid-line: there every distinct line meshrun's workers reported
    (what they printed, and their exceptions) must be among torchrun's, rank
    numbers normalized;
  - the line the case pins (a seed's printout, or the error a CUDA-only seed
    meets on a machine without a GPU) among them.

Every case runs in a network namespace of its own (unshare --net, as root), so
the seeds' fixed ports (29400, torchrun's default 29500) are free and nothing
else on the machine can answer on them.

Usage: seeds_test.py --meshrun BIN --torchrun BIN --python PY CASE
       seeds_test.py --list
"""

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "seeds")
DEADLINE_S = 300  # per launcher run; a hung run is killed and fails the case

Case = collections.namedtuple("Case", "script flags nodes exit_code pinned")

CASES = {
    # Seed 000: the mesh printouts for (2, 3) and (3, 2).
    "mesh_2x3": Case(
        "000_parallelism/mesh_2x3.py",
        ["--node_rank=0", "--nproc_per_node=6", "--nnodes=1", "--standalone"],
        1,
        0,
        "Rank: 5, DeviceMesh((tp=3), 'cpu', stride=(1,))",
    ),
    "mesh_3x2": Case(
        "000_parallelism/mesh_3x2.py",
        ["--node_rank=0", "--nproc_per_node=6", "--nnodes=1", "--standalone"],
        1,
        0,
        "Rank: 5, DeviceMesh((tp=2), 'cpu', stride=(1,))",
    ),
    # Seed 000: FSDP1 HYBRID_SHARD on (2, 4). torch 2.15's FSDP1 refuses a
    # CPU-only machine; that is what both launchers must show.
    "hsdp_fsdp1": Case(
        "000_parallelism/hsdp_fsdp1.py",
        ["--node_rank=0", "--nproc_per_node=8", "--nnodes=1", "--standalone"],
        1,
        1,
        "RuntimeError: FSDP needs a non-CPU accelerator device, but no accelerator "
        "device is detected.",
    ),
    # Seed 000: FSDP2 HSDP on (2, 4), and FSDP2 + TP with full_tensor.
    "hsdp_fsdp2": Case(
        "000_parallelism/hsdp_fsdp2.py",
        ["--node_rank=0", "--nproc_per_node=8", "--nnodes=1", "--standalone"],
        1,
        0,
        "Global rank: 6, dp_rank: 1, fsdp_rank:2, Weights array: "
        "[DTensor(local_tensor=tensor([151., 152., 153., 154., 155., 156., 157., "
        "158., 159., 160., 161., 162.,",
    ),
    "fsdp2_tp": Case(
        "000_parallelism/fsdp2_tp.py",
        ["--node_rank=0", "--nproc_per_node=4", "--nnodes=1", "--standalone"],
        1,
        0,
        # full_tensor()'s third row: in order (the seed saw 137.. in its second).
        "125., 126., 127., 128., 129., 130., 131., 132., 133., 134., 135., 136.,",
    ),
    # Seed 001: the recipe's programs, CUDA and NCCL as written, with its
    # command lines (the first one's fixed endpoint included).
    "recipe_2d_setup": Case(
        "001_device_mesh_recipe/2d_setup.py",
        ["--nproc_per_node=8", "--rdzv_id=100", "--rdzv_endpoint=localhost:29400"],
        1,
        1,
        "RuntimeError: nccl2 requires at least one CUDA device",
    ),
    "recipe_hsdp": Case(
        "001_device_mesh_recipe/hsdp.py",
        ["--nproc_per_node=8"],
        1,
        1,
        "RuntimeError: Found no NVIDIA driver on your system. Please check that "
        "you have an NVIDIA GPU and installed a driver from "
        "http://www.nvidia.com/Download/index.aspx",
    ),
    # Seed 002: DDP with @record, DistributedSampler and a checkpoint around a
    # barrier, elastic as its multinode.sh: two agents of 2 workers.
    "ddp_elastic": Case(
        "002_ddp_elastic/train_script.py",
        [
            "--nnodes=1:4",
            "--nproc_per_node=2",
            "--node_rank=0",
            "--max-restarts=3",
            "--rdzv_id=seed002",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:29400",
        ],
        2,
        0,
        "rank 3 epoch 2 loss",
    ),
    # Seed 003: TP + PP on 2 nodes x 2 workers, the seed's torchrun line. Its
    # layers live on cuda:LOCAL_RANK as written.
    "tp_pp": Case(
        "003_tp_pp/2d_parallelism.py",
        [
            "--nnodes=2",
            "--nproc_per_node=2",
            "--rdzv_id=1234",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:29500",
        ],
        2,
        1,
        "RuntimeError: Found no NVIDIA driver on your system. Please check that "
        "you have an NVIDIA GPU and installed a driver from "
        "http://www.nvidia.com/Download/index.aspx",
    ),
}

# The launchers' own lines, left out of the comparison.
TORCH_LOG = re.compile(r"^[IWEDC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")  # torchrun's logger
MESHRUN_LOG = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[[\w-]+\] \[\w+\] ")  # meshrun's spdlog
# The TCPStore server logs each client whose name it cannot look up (none
# can be in a fresh network namespace). torchrun's agent hosts that store;
# meshrun's workers use its daemon's (TORCHELASTIC_USE_AGENT_STORE=True, or
# rank 0's own with a token or TLS), so the count of these lines tells which
# process serves the store, not what the program printed.
STORE_SERVER_LOG = re.compile(
    r"^\[W\d{4} [\d:.]+ socket\.cpp:\d+\] \[c10d\] The hostname of "
    r"the client socket cannot be retrieved"
)
# Likewise c10d's reports of a store connection closing at the end of a run
# (with the C++ stack they carry): torchrun's second agent prints them when the
# first, its store's host, exits before it (in its exit barrier, whose wait
# and next call fail); they tell who held the store.
STORE_CLOSED_LOG = re.compile(
    r"^(\[W\d{4} [\d:.]+ TCPStore\.cpp:\d+\] \[c10d\] "
    r"(recvVector|recvValueWithTimeout|sendBytes) failed"
    r"|Exception raised from (recvBytes|sendBytes) at |frame #\d+: )"
)

NORMALIZE = [
    (re.compile(r"\b([IWEDC])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "), r"\1<time> <pid> "),
    (re.compile(r"\b\d{4}-\d\d-\d\d[_ T]\d\d:\d\d:\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"\b(pid|PID)([:= ]+)\d+"), r"\1\2<pid>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "0x<addr>"),
    (re.compile(r"(127\.0\.0\.1|localhost|\[::1\]):\d+"), r"\1:<port>"),
]
RANKS = [
    (re.compile(r"\[rank\d+\]:"), "[rankN]:"),
    (re.compile(r"\brank([=: ]+)\d+"), r"rank\1N"),
    (re.compile(r"^\d+ torch\.Size"), "N torch.Size"),
]


def launcher_lines_dropped(stderr):
    """stderr without the launcher's own lines: its log records and, for
    torchrun, the ChildFailedError traceback it ends with."""
    lines = stderr.splitlines()
    kept = []
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line == "Traceback (most recent call last):" and following.rstrip().endswith(
            '/bin/torchrun", line 8, in <module>'
        ):
            break  # torchrun's own failure report runs to the end
        if line.startswith("meshrun: ") and following.startswith("====="):
            break  # so does meshrun's
        if any(p.match(line) for p in (TORCH_LOG, MESHRUN_LOG, STORE_SERVER_LOG, STORE_CLOSED_LOG)):
            continue
        kept.append(line)
    return kept


def normalized(line, ranks_too):
    for pattern, replacement in NORMALIZE + (RANKS if ranks_too else []):
        line = pattern.sub(replacement, line)
    return line.rstrip()


# Where a worker's line begins. torchrun 2 runs workers as python -u on one
# shared pipe, where print() writes its text and its newline in two writes,
# so another worker's line can land between them ("A..B..\n\n"; meshrun
# passes whole lines). The comparison splits such a line where a second one
# begins, and drops empty lines.
LINE_STARTS = re.compile(
    r"(?<=.)(?<!\]: )(?=\[rank\d+\]:|Rank: \d|Global rank: \d|rank \d+ epoch \d"
    r"|Running example on rank=\d"
    r"|Traceback \(most recent call last\))"
)
# What a failing worker reports: its exception's line.
EXCEPTION = re.compile(r"^(\[rankN\]: )?[\w.]*(Error|Exception)\b.*: ")


def worker_lines(runs, ranks_too):
    lines = []
    for stdout, stderr in runs:
        for line in stdout.splitlines() + launcher_lines_dropped(stderr):
            lines += LINE_STARTS.split(line)
    return [normalized(line, ranks_too) for line in lines if line.strip()]


def reported(lines):
    """The distinct lines a failed run's workers reported: what they printed
    (stdout-style lines) and their exceptions' lines, without traceback
    detail."""
    return sorted(
        {
            line
            for line in lines
            if EXCEPTION.match(line)
            or not line.startswith(("[rankN]:", " ", "Traceback", "^", "~"))
        }
    )


def launch(commands, env):
    """Starts every command at once; returns (exit codes, [(stdout, stderr)])."""
    procs = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )
        for cmd in commands
    ]
    results = [None] * len(procs)

    def drain(i):  # each launcher's pipes read at once: none can fill and stall
        results[i] = procs[i].communicate()

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    deadline = time.monotonic() + DEADLINE_S
    try:
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout=max(0, deadline - time.monotonic()))
        if any(reader.is_alive() for reader in readers):
            raise SystemExit(f"FAIL: {commands[0][0]} did not end within {DEADLINE_S} s")
    finally:
        for proc in procs:  # every process group we started ends with us
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for reader in readers:  # a worker that outlived its launcher may hold a pipe
            reader.join(timeout=10)
    return [proc.returncode for proc in procs], results


# torch 2.15's Gloo threads drop a finished work's tensors (a Python decref)
# after the work completes; when that happens while the interpreter is
# finalizing, the thread exits inside the decref and the process aborts
# (gdb: ProcessGroupGloo::runLoop -> ~AsyncWork -> decref -> PyThread_exit_thread
# -> std::terminate). It hit 3 of 14 plain torchrun runs of a DDP script here,
# torchrun's and meshrun's workers alike, after every line was printed. The
# seeds' programs stay as written, so a run whose only failure is that
# abort, once the program was done, runs again (once): what is compared is the
# launchers, not this race in torch.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def aborted_at_exit_only(case, codes, runs):
    return (
        case.exit_code == 0
        and any(code != 0 for code in codes)
        and any(GLOO_EXIT_ABORT in err for _, err in runs)
        and not any(
            "Traceback (most recent call last)" in err.split(GLOO_EXIT_ABORT)[0] for _, err in runs
        )
    )


def run_case(name, case, args):
    script = os.path.normpath(os.path.join(SEEDS, case.script))
    workdir = tempfile.mkdtemp(prefix=f"seeds-{name}-")
    env = dict(os.environ)
    # Both launchers start workers with this interpreter (torchrun reads
    # PYTHON_EXEC as meshrun does), and a program's temp files stay its own.
    env.update(PYTHON_EXEC=args.python, TMPDIR=workdir)
    outcome = {}
    for launcher in ("torchrun", "meshrun"):
        binary = args.torchrun if launcher == "torchrun" else args.meshrun
        started = time.monotonic()
        codes, runs = launch([[binary] + case.flags + [script]] * case.nodes, env)
        if aborted_at_exit_only(case, codes, runs):
            print(
                f"{name}: {launcher} exited {codes}: a worker aborted at exit "
                f"({GLOO_EXIT_ABORT!r}, torch's Gloo race); running it again"
            )
            codes, runs = launch([[binary] + case.flags + [script]] * case.nodes, env)
        outcome[launcher] = codes, runs
        print(f"{name}: {launcher} exited {codes} in {time.monotonic() - started:.1f} s")
    failed = case.exit_code != 0
    problems = []
    (torch_codes, torch_runs), (mesh_codes, mesh_runs) = outcome["torchrun"], outcome["meshrun"]
    if torch_codes != [case.exit_code] * case.nodes:
        problems.append(f"torchrun exited {torch_codes}, the case pins {case.exit_code}")
    if mesh_codes != torch_codes:
        problems.append(f"meshrun exited {mesh_codes}, torchrun {torch_codes}")
    want = worker_lines(torch_runs, ranks_too=failed)
    got = worker_lines(mesh_runs, ranks_too=failed)
    if failed:
        # Which workers print before the launcher stops them after the first
        # failure is up to the scheduler, and under torchrun several
        # tracebacks written at once interleave mid-line, beyond repair. So:
        # every line meshrun's workers reported, torchrun's reported too (as
        # a line, or inside an interleaved one), and the pinned error below.
        want_text = "\n".join(want)
        got = reported(got)
        want = [line for line in got if line in want_text]
    else:
        want, got = sorted(want), sorted(got)
    if want != got:
        missing = list((collections.Counter(want) - collections.Counter(got)).elements())
        extra = list((collections.Counter(got) - collections.Counter(want)).elements())
        problems.append(
            "worker lines differ\n  only under torchrun:\n    "
            + "\n    ".join(missing[:40])
            + "\n  only under meshrun:\n    "
            + "\n    ".join(extra[:40])
        )
    pinned = normalized(case.pinned, failed)
    if not any(pinned in line for line in got):
        problems.append(f"meshrun's workers never printed the pinned line: {case.pinned}")
    if problems:
        for launcher, (_codes, runs) in outcome.items():
            for node, (out, err) in enumerate(runs):
                print(f"----- {launcher} node {node} stdout\n{out}----- stderr\n{err}")
        print(f"FAIL {name}:\n" + "\n".join(problems))
        return 1
    print(
        f"PASS {name}: exit {mesh_codes}, {len(got)} "
        f"{'distinct ' if failed else ''}worker lines equal"
    )
    subprocess.run(["rm", "-rf", workdir], check=False)
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun")
    parser.add_argument("--torchrun")
    parser.add_argument("--python")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("case", nargs="?")
    args = parser.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0
    if args.case not in CASES:
        print(f"unknown case {args.case!r}; one of {', '.join(CASES)}")
        return 2
    # The private network namespace (the ctest command runs us under
    # unshare --net) starts with loopback down.
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return run_case(args.case, CASES[args.case], args)


if __name__ == "__main__":
    sys.exit(main())

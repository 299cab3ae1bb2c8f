"""Restart-free recovery for PyTorch programs (meshrun.ft) under meshrun.

The seeds' programs with their meshrun.ft lines, under
meshrun --restart-scope=replica:
  - seed 002's DDP script (examples/seeds/002_ddp_elastic/train_script_ft.py):
    two replica groups of two workers, DDP inside each group;
  - seed 000's FSDP2 HSDP (examples/seeds/000_parallelism/hsdp_fsdp2_ft.py):
    its (2, 4) mesh as two replica groups of four, fully_shard inside each.

Cases:
  ddp, hsdp  a worker of replica 1 SIGKILLed mid-training: the run succeeds,
             replica 0's workers keep their pids, the restarted group is
             healed while the survivors train on and rejoins (it trains steps
             with them again; its records say restart 1), and every worker's
             final parameters equal a replay of the committed steps in one
             process, each step on its participants' data only (the replay
             draws the batches with torch's own DistributedSampler, so the
             step-to-batch mapping is checked too). Replica 0 is SIGSTOPped
             from replica 1's restart until replica 1 is at the quorum, so
             that it always finds replica 0 training, however slow the
             restart (hold_survivors_until_back).
  elastic    seed 002's script as its multinode.sh launches it (--nnodes=1:2,
             two workers a node, here one replica group a node) on a
             meshrun-rdzvd: node A trains alone, node B joins mid-training
             (healed from A, no re-form), B is lost (its agent and workers
             SIGKILLed: A trains on alone), node C joins and takes B's slot
             (healed); A's workers keep their pids, nobody restarts, and every
             worker equals the replay of the committed steps, whose
             participants went [0], [0, 1], [0], [0, 1]. A newcomer joins
             while A's workers are SIGSTOPped (the C++ test's holds), so that
             it always finds A training, however slow the machine.
  scope      seed 002's script under --restart-scope=job: one line naming the
             flag, exit code 2, and no step trained.
  callback   a heal's source whose state_dict callback raises
             (ft_callback_worker.py): it ends with one line naming the
             callback; the restarted groups, none of which holds the state,
             are refused by the quorum with one line (DATA_LOSS) until the
             restart budget is spent; the run fails; no step is trained from
             zero again.
  torchft    torchft's habit of one launcher per replica group, with meshrun in
             torchrun's place: a torchft DDP program (the recovery benchmark's,
             bench/recovery/ft_python_recovery.py --system torchft, on
             torchft 0.2.0's Manager, DistributedDataParallel and Optimizer)
             as two replica groups, each under its own meshrun --standalone,
             with torchft's Lighthouse (bench/recovery/torchft_launch.py
             --meshrun); replica 1 SIGKILLs itself at step 15: its meshrun
             restarts it, torchft heals it, both finish; replica 0 keeps its
             pid.
  backend    ft.init_process_group() with no backend on CPU (two replica
             groups of one worker): all 5 steps commit; with backend="nccl"
             and no CUDA: one line a worker, exit code 2, no step.
  changes    each copy differs from its seed in exactly its marked lines (the
             numbers docs/fault-tolerance.md gives).

Usage: ft_python_test.py --meshrun BIN --python PY --pythonpath P CASE
"""

import argparse
import difflib
import io
import itertools
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from launched import Daemon, Run
from torch.utils.data.distributed import DistributedSampler

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "seeds")
DEADLINE_S = 240


@dataclass(frozen=True)
class Program:
    seed: str  # the seed's program, under examples/seeds
    ft: str  # its copy with meshrun.ft
    meshrun_ft_lines: int  # lines ending in "# meshrun.ft" (docs/fault-tolerance.md)
    added_lines: int  # lines marked "# added:" beyond the seed's (a loop it lacks)
    nproc: int
    replica_size: int
    args: list[str]
    steps: int  # the training's length in steps
    killed_after: str  # a line of output after which a worker is killed
    # A line the survivors print once they trained alone after that: two
    # epochs on (one the killed group's other members cannot finish: their
    # peer is dead; two, so that it was not printed before the kill).
    trained_alone: str
    replay: Callable[[list[list[int]]], dict[str, torch.Tensor]]
    model_prefix: str  # the model's keys in the records (DDP's "module.")


def samplers(dataset_len: int, shards: int) -> list[DistributedSampler]:
    return [
        DistributedSampler(range(dataset_len), num_replicas=shards, rank=r) for r in range(shards)
    ]


def batch_of(sampler: DistributedSampler, epoch: int, k: int, batch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)[k * batch : (k + 1) * batch]


def replay_ddp(history: list[list[int]]) -> dict[str, torch.Tensor]:
    """Seed 002's model and data, as its workers build them; SGD lr 1e-3."""
    sys.path.insert(0, os.path.join(SEEDS, "002_ddp_elastic"))
    import train_script

    torch.manual_seed(0)
    model = train_script.MyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = train_script.RandomDataset(512)
    shards = samplers(len(dataset), 4)
    per_epoch = len(shards[0])  # batch 1
    params = list(model.parameters())
    for step, participants in enumerate(history):
        epoch, k = divmod(step, per_epoch)
        # As the workers add them up, so that float32 rounds alike: DDP sums
        # a replica group's two members, then meshrun.ft sums the groups.
        # (Scaling by 1/2 or 1/4 is exact, so where the division falls does
        # not matter.) One sum of all four would round differently, and
        # 3072 steps of that drift apart by about 1e-5.
        totals: list[torch.Tensor] = []
        for p in participants:
            optimizer.zero_grad()
            for m in range(2):
                (i,) = batch_of(shards[p * 2 + m], epoch, k, 1)
                x, y = dataset[i]
                (F.cross_entropy(model(x[None]), y[None]) / (2 * len(participants))).backward()
            grads = [param.grad.clone() for param in params]
            totals = grads if not totals else [t + g for t, g in zip(totals, grads, strict=True)]
        for param, total in zip(params, totals, strict=True):
            param.grad = total
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def replay_hsdp(history: list[list[int]]) -> dict[str, torch.Tensor]:
    """hsdp_fsdp2_ft.py's model (relu(W x), W = 101..200 as 10x10) and data."""
    weight = torch.arange(101.0, 201.0).view(10, 10).requires_grad_()
    optimizer = torch.optim.SGD([weight], lr=1e-2)
    inputs = torch.randn(1024, 10, generator=torch.Generator().manual_seed(0))
    shards = samplers(len(inputs), 8)
    per_epoch = len(shards[0])
    for step, participants in enumerate(history):
        epoch, k = divmod(step, per_epoch)
        optimizer.zero_grad()
        ranks = [p * 4 + m for p in participants for m in range(4)]
        for rank in ranks:
            (i,) = batch_of(shards[rank], epoch, k, 1)
            (torch.relu(inputs[i : i + 1] @ weight.T).mean() / len(ranks)).backward()
        optimizer.step()
    return {"net1.weight": weight.detach()}


def replay_difference(
    record: dict, expected: dict[str, torch.Tensor], prefix: str, who: str
) -> float:
    """The largest difference of a worker's parameters from the replay's;
    fails beyond float32's noise."""
    worst = 0.0
    for name, value in expected.items():
        got = record["model"][prefix + name]
        diff = (got - value).abs().max().item()
        if not torch.allclose(got, value, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"{who}: {name} differs from the replay by {diff}")
        worst = max(worst, diff)
    return worst


PROGRAMS = {
    # 512 samples / 4 shards = 128 steps an epoch, 24 epochs: 3072 steps
    # (about 5 ms each here); the group killed after epoch 1 is back in
    # about 4 s (replica 0 is held for it where it takes longer: see
    # hold_survivors_until_back).
    "ddp": Program(
        seed="002_ddp_elastic/train_script.py",
        ft="002_ddp_elastic/train_script_ft.py",
        meshrun_ft_lines=7,
        added_lines=0,
        nproc=4,
        replica_size=2,
        args=["--batch_size", "1", "--max-epochs", "24"],
        steps=3072,
        killed_after=r"rank \d epoch 1 loss",
        trained_alone=r"rank \d epoch 3 loss",
        replay=replay_ddp,
        model_prefix="module.",
    ),
    # 1024 samples / 8 shards = 128 steps an epoch, 12 epochs.
    "hsdp": Program(
        seed="000_parallelism/hsdp_fsdp2.py",
        ft="000_parallelism/hsdp_fsdp2_ft.py",
        meshrun_ft_lines=8,
        added_lines=16,
        nproc=8,
        replica_size=4,
        args=["--epochs", "12"],
        steps=1536,
        killed_after=r"Global rank: \d, epoch 0, loss",
        trained_alone=r"Global rank: \d, epoch 2, loss",
        replay=replay_hsdp,
        model_prefix="",
    ),
}


def worker_pids(token: str) -> dict[int, int]:
    """RANK -> pid of the workers carrying FT_TEST_TOKEN=token."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"FT_TEST_TOKEN") == token.encode() and b"RANK" in env:
            pids[int(env[b"RANK"])] = int(entry)
    return pids


def daemon_connections(pid: int) -> int:
    """Process `pid`'s TCP connections ESTABLISHED to the daemon's port (its
    MESHRUN_STORE_ENDPOINT, which also serves the workers' TCPStore)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        port = int(env[b"MESHRUN_STORE_ENDPOINT"].rsplit(b":", 1)[1])
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except (OSError, KeyError, ValueError):
        return 0  # gone, or not there yet
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st ... uid timeout inode
            if row[3] == "01" and int(row[2].rsplit(":", 1)[1], 16) == port and row[9] in inodes:
                count += 1
    return count


# A worker of seed 002's or 000's program at its first step quorum has three
# connections to the daemon's port: init_process_group's TCPStore client
# (from the start of the program), then ft.Manager's own TCPStore client and
# its DaemonClient's channel, which connects lazily on its first call: the
# Manager's first quorum, right after.
AT_QUORUM_CONNECTIONS = 3


def metric_sum(endpoint: str, name: str, label: str = "") -> int:
    """The sum of metric `name`'s samples (those whose labels contain
    `label`) on the daemon's /metrics."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line
    )


def launch(
    args: argparse.Namespace, program: Program, flags: list[str], workdir: str, token: str
) -> Run:
    env = dict(os.environ)
    env.update(
        PYTHON_EXEC=args.python,
        PYTHONPATH=args.pythonpath,
        TMPDIR=workdir,  # seed 002's checkpoint goes to tempfile.gettempdir()
        FT_TEST_TOKEN=token,
        MESHRUN_FT_RECORD_DIR=workdir,
    )
    # --standalone unless the flags name a rendezvous.
    standalone = [] if any(f.startswith("--rdzv-endpoint") for f in flags) else ["--standalone"]
    command = [args.meshrun, *standalone, f"--nproc-per-node={program.nproc}", *flags]
    return Run([*command, os.path.join(SEEDS, program.ft), *program.args], env)


def load_records(workdir: str, program: Program) -> list[dict]:
    """Every worker's record (ft.Manager's MESHRUN_FT_RECORD_DIR), its model
    state as plain tensors: a DTensor's local shard, the members' shards put
    together along the dimension FSDP2 shards (0)."""
    from meshrun import _state

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value.local if isinstance(value, _state._LocalShard) else value

    records = []
    for r in range(program.nproc // program.replica_size):
        group = []
        for m in range(program.replica_size):
            path = os.path.join(workdir, f"replica{r}_member{m}.pt")
            if not os.path.exists(path):
                raise AssertionError(f"no record from replica {r} member {m}")
            record = torch.load(path, weights_only=False)
            state = torch.load(io.BytesIO(record["state"]), weights_only=False)
            record["model"] = plain(state)["model"]
            group.append(record)
        if program.replica_size > 1 and program.model_prefix == "":
            whole = {k: torch.cat([g["model"][k] for g in group]) for k in group[0]["model"]}
            for record in group:
                record["model"] = whole
        records.extend(group)
    return records


def hold_survivors_until_back(
    run: Run,
    program: Program,
    token: str,
    before: dict[int, int],
    killed_at: int,
    metrics: str,
    deadline: float,
) -> float:
    """Keeps replica 0 from finishing before the restarted replica 1 is back
    at the step quorum, however slow its restart (on a loaded machine it can
    take longer than the survivors' remaining steps). Once replica 0 has
    trained alone (program.trained_alone) and replica 1's new workers exist,
    replica 0's workers are SIGSTOPped until the daemon has all of replica
    1's waiting at the quorum (or a quorum of both groups formed), then go
    on: the quorum waits for every live group (replica 0 is one) until the
    earliest arrival's deadline (the Manager's quorum_timeout, 30 s), so
    replica 0, resumed at once, forms the next quorum with replica 1, which
    is healed mid-training and trains jointly. Replica 0 is held only where
    none of its members waits at the quorum: such a member's deadline would
    pass while held and could form a quorum of replica 1 alone (refused: it
    lacks the committed steps). Returns how long replica 0 was held."""
    size = program.replica_size
    survivors = [before[m] for m in range(size)]
    old = set(before.values())

    def check(what: str) -> None:
        if time.monotonic() > deadline or run.proc.poll() is not None:
            raise AssertionError(f"{what}:\n" + "\n".join(run.output()[-30:]))
        time.sleep(0.05)

    def waiting() -> int:
        return metric_sum(metrics, "meshrun_run_step_quorum_waiting", 'call="quorum"')

    # Quorums with two or more groups so far (each counts one group as the last).
    joint = "meshrun_replica_quorum_last_total"
    restarted: list[int | None] = [None]
    while not all(pid is not None and pid not in old for pid in restarted):
        pids = worker_pids(token)
        restarted = [pids.get(r) for r in range(size, 2 * size)]
        check("replica 1 never restarted")
    joint_before = metric_sum(metrics, joint)
    alone = re.compile(program.trained_alone)
    while not any(alone.search(line) for line in run.output()[killed_at:]):
        check("replica 0 never trained alone")

    def at_quorum() -> bool:
        return all(daemon_connections(pid) >= AT_QUORUM_CONNECTIONS for pid in restarted)

    while True:
        arrived = at_quorum()
        for pid in survivors:
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        if arrived:
            break  # for a moment only: replica 1 is arriving
        if waiting() == 0 and not at_quorum():
            # Nobody at the quorum (replica 1 not yet there): hold until it is.
            hold_until = min(deadline, stopped + 90)  # the Manager retries for 3 quorum timeouts
            while not at_quorum():
                if time.monotonic() > hold_until:
                    for pid in survivors:
                        os.kill(pid, signal.SIGCONT)
                    raise AssertionError(
                        "the restarted replica 1 never reached the step quorum:\n"
                        + "\n".join(run.output()[-30:])
                    )
                time.sleep(0.05)
            break
        # A member of replica 0 waits at the quorum (or replica 1 just
        # arrived): let the quorum form, try again.
        for pid in survivors:
            os.kill(pid, signal.SIGCONT)
        check("replica 0 never stopped between steps")
    try:
        # Replica 1's members all at the quorum; replica 0's that were there
        # when it stopped add fewer than `size` (all of them there would have
        # formed a quorum, unless with replica 1). Well under the deadline.
        hold_until = min(deadline, time.monotonic() + 20)
        while waiting() < size and metric_sum(metrics, joint) == joint_before:
            if time.monotonic() > hold_until:
                raise AssertionError(
                    "the restarted replica 1 never arrived at the step quorum:\n"
                    + "\n".join(run.output()[-30:])
                )
            time.sleep(0.05)
    finally:
        for pid in survivors:
            os.kill(pid, signal.SIGCONT)
    return time.monotonic() - stopped


def case_kill(args: argparse.Namespace, program: Program) -> None:
    token = uuid.uuid4().hex
    deadline = time.monotonic() + DEADLINE_S
    flags = [
        "--restart-scope=replica",
        f"--replica-size={program.replica_size}",
        "--max-restarts=3",
        "--metrics-port=0",  # the embedded daemon's /metrics, for the hold
    ]
    victim = program.replica_size  # replica 1, member 0
    with tempfile.TemporaryDirectory() as workdir:
        run = launch(args, program, flags, workdir, token)
        try:
            if not run.wait_for(program.killed_after, deadline):
                raise AssertionError("training never got there:\n" + "\n".join(run.output()[-30:]))
            before = worker_pids(token)
            assert sorted(before) == list(range(program.nproc)), before
            served = [
                m.group(1)
                for line in run.output()
                if (m := re.search(r"status page and metrics on http://([^/ ]+)/", line))
            ]
            assert served, "no metrics endpoint:\n" + "\n".join(run.output()[:20])
            metrics = served[0]
            killed_at = len(run.output())
            os.kill(before[victim], signal.SIGKILL)
            held = hold_survivors_until_back(
                run, program, token, before, killed_at, metrics, deadline
            )
            rc = run.finish(deadline)
        finally:
            run.stop()
        out = run.output()
        if os.environ.get("FT_TEST_VERBOSE"):
            print("\n".join(out))
        if rc != 0:
            raise AssertionError(f"meshrun exited {rc}:\n" + "\n".join(out[-40:]))
        healed = [line for line in out if "healed from replica 0" in line]
        assert len(healed) == program.replica_size, "\n".join(out[-40:])
        records = load_records(workdir, program)
        history = records[0]["history"]
        alone = sum(1 for h in history if h == [0])
        # Back before the end: it trained steps with the survivors again.
        back = max(i for i, h in enumerate(history) if h == [0]) + 1
        assert 0 < alone and back < len(history), f"{alone} steps alone, back at step {back}"
        expected = program.replay(history)
        worst = 0.0
        for record in records:
            who = f"replica {record['replica']} member {record['member']}"
            assert record["steps"] == program.steps, f"{who}: {record['steps']} steps"
            assert record["history"] == history, f"{who}: another history"
            if record["replica"] == 0:
                assert record["pid"] == before[record["member"]], f"{who}: a new pid"
                assert record["incarnation"] == 0, who
            else:
                assert record["incarnation"] == 1, f"{who}: restart {record['incarnation']}"
            worst = max(worst, replay_difference(record, expected, program.model_prefix, who))
        print(
            f"ok: {program.steps} steps, {alone} by replica 0 alone, replica 1 back at step "
            f"{back} (pid {before[victim]} killed; replica 0 held {held:.2f} s); every worker "
            f"equals the replay (largest difference {worst:.1e})"
        )


def case_elastic(args: argparse.Namespace) -> None:
    program = PROGRAMS["ddp"]  # 4 shards at full strength: the replay is the same
    run_id = "ftelastic"
    deadline = time.monotonic() + DEADLINE_S
    daemon = Daemon(args.meshrun, deadline)
    nodes: dict[str, Run] = {}
    tokens = {name: uuid.uuid4().hex for name in "ABC"}
    flags = [
        "--nnodes=1:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={daemon.endpoint}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=last_call_timeout=1",
        "--restart-scope=replica",
        "--replica-size=2",
        "--max-restarts=0",  # any restart fails the run
    ]
    node_program = Program(**{**program.__dict__, "nproc": 2})

    def expect(name: str, pattern: str) -> None:
        if not nodes[name].wait_for(pattern, deadline):
            tails = {n: "\n".join(r.output()[-25:]) for n, r in nodes.items()}
            raise AssertionError(f"node {name} never printed {pattern!r}: {tails}")

    def join_while_a_holds(name: str) -> None:
        """Node `name` joins while A's workers are stopped, so that they are
        still training when its groups arrive at the quorum."""
        nodes[name] = launch(args, node_program, flags, workdir, tokens[name])
        while len(worker_pids(tokens[name])) < 2:
            if time.monotonic() > deadline or nodes[name].proc.poll() is not None:
                raise AssertionError("\n".join(nodes[name].output()[-30:]))
            time.sleep(0.05)
        held = worker_pids(tokens["A"]).values()
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        try:
            # A's members waiting at the quorum now stay as they are; the
            # newcomer's two add to them. Under the quorum timeout (30 s).
            time.sleep(0.5)
            before = daemon.waiting_at_quorum(run_id)
            hold_until = min(deadline, time.monotonic() + 25)
            while daemon.waiting_at_quorum(run_id) < before + 2:
                if time.monotonic() > hold_until:
                    raise AssertionError(
                        f"node {name}'s workers never reached the quorum ({before} waiting "
                        "before them):\n" + "\n".join(nodes[name].output()[:30])
                    )
                time.sleep(0.1)
        finally:
            for pid in held:
                os.kill(pid, signal.SIGCONT)

    with tempfile.TemporaryDirectory() as workdir:
        try:
            nodes["A"] = launch(args, node_program, flags, workdir, tokens["A"])
            expect("A", r"^rank 0 epoch 0 loss")
            a_pids = worker_pids(tokens["A"])
            join_while_a_holds("B")
            # Ranks in the seed's lines are those of the replica group (the
            # default group): B trained an epoch with A.
            expect("B", r"healed from replica 0")
            expect("B", r"^rank 0 epoch \d+ loss")
            os.killpg(nodes["B"].proc.pid, signal.SIGKILL)  # the node is lost
            nodes["B"].stop()
            lost_at = len(nodes["A"].output())
            while not any(
                re.match(r"rank 0 epoch", line) for line in nodes["A"].output()[lost_at:]
            ):
                if time.monotonic() > deadline or nodes["A"].proc.poll() is not None:
                    raise AssertionError(
                        "A stopped training:\n" + "\n".join(nodes["A"].output()[-30:])
                    )
                time.sleep(0.05)
            join_while_a_holds("C")
            codes = {name: nodes[name].finish(deadline) for name in "AC"}
        finally:
            for run in nodes.values():
                run.stop()
            daemon.stop()
        out = {name: run.output() for name, run in nodes.items()}
        if os.environ.get("FT_TEST_VERBOSE"):
            for name, lines in out.items():
                print(f"--- node {name}\n" + "\n".join(lines))
        for name, rc in codes.items():
            assert rc == 0, f"node {name} exited {rc}:\n" + "\n".join(out[name][-40:])
        for name in "AC":
            text = "\n".join(out[name])
            assert "restarting" not in text and "re-form" not in text, text[-4000:]
        for name in "BC":
            healed = [line for line in out[name] if "healed from replica 0" in line]
            assert len(healed) == 2, f"node {name}: {healed}"
        records = load_records(workdir, Program(**{**program.__dict__, "nproc": 4}))
        history = records[0]["history"]
        phases = [h for i, h in enumerate(history) if i == 0 or history[i - 1] != h]
        spans = [sum(1 for _ in g) for _, g in itertools.groupby(map(tuple, history))]
        assert phases == [[0], [0, 1], [0], [0, 1]], (phases, spans)
        expected = program.replay(history)
        worst = 0.0
        for record in records:
            who = f"replica {record['replica']} member {record['member']}"
            assert record["steps"] == program.steps, f"{who}: {record['steps']} steps"
            assert record["history"] == history, f"{who}: another history"
            assert record["incarnation"] == 0, f"{who}: restart {record['incarnation']}"
            if record["replica"] == 0:
                assert record["pid"] == a_pids[record["member"]], f"{who}: a new pid"
            worst = max(worst, replay_difference(record, expected, program.model_prefix, who))
        print(
            f"ok: {program.steps} steps, participants {phases} for {spans} steps; A kept its "
            f"pids; every worker equals the replay (largest difference {worst:.1e})"
        )


def case_scope(args: argparse.Namespace) -> None:
    program = PROGRAMS["ddp"]
    with tempfile.TemporaryDirectory() as workdir:
        run = launch(args, program, ["--max-restarts=0"], workdir, uuid.uuid4().hex)
        rc = run.finish(time.monotonic() + DEADLINE_S)
    out = run.output()
    text = "\n".join(out)
    errors = [line for line in out if line.startswith("meshrun.ft: ")]
    assert rc != 0, text
    # The first worker's exit stops the others, which may not get to say it.
    assert errors and "--restart-scope=job" in errors[0], text
    assert len(set(errors)) == 1, errors
    assert "exitcode  : 2" in text, text
    assert not any("epoch" in line for line in out), text
    print("ok:", errors[0])


def run_callback_worker(args: argparse.Namespace, mode: str) -> tuple[int, list[str]]:
    """ft_callback_worker.py MODE under meshrun (two replica groups of one
    worker): its exit code and output lines."""
    env = dict(os.environ, PYTHON_EXEC=args.python, PYTHONPATH=args.pythonpath)
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ft_callback_worker.py")
    run = Run(
        [args.meshrun, "--standalone", "--nproc-per-node=2", "--restart-scope=replica",
         "--max-restarts=3", worker, mode],
        env,
    )  # fmt: skip
    return run.finish(time.monotonic() + DEADLINE_S), run.output()


CALLBACK_RAISED = (
    "meshrun.ft: the state_dict callback raised ValueError: the program cannot give its state"
)


def case_callback(args: argparse.Namespace) -> None:
    rc, out = run_callback_worker(args, "heal")
    text = "\n".join(out)
    assert rc != 0, text
    raised = [line for line in out if line.startswith("meshrun.ft: the state_dict callback")]
    assert raised, text
    assert raised[0] == CALLBACK_RAISED, raised[0]
    lost = [line for line in out if line.startswith("meshrun.ft: step quorum: ")]
    assert lost and "committed steps is lost" in lost[0], text
    # Replica 0 trained from step 0 once, in its first life, never again.
    assert sum(1 for line in out if line == "replica 0 trained step 0") == 1, text
    print("ok:", raised[0], "|", lost[0])


def case_backend(args: argparse.Namespace) -> None:
    """ft.init_process_group() with no backend, on CPU: every step commits
    (it was torch's 'undefined', which made the replica dimension NCCL over
    CPU tensors: every step discarded). backend='nccl' without CUDA: one
    line, exit 2, no step."""
    steps = 5
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ft_backend_worker.py")
    env = dict(os.environ, PYTHON_EXEC=args.python, PYTHONPATH=args.pythonpath)
    results = {}
    for backend in ("default", "nccl"):
        run = Run(
            [args.meshrun, "--standalone", "--nproc-per-node=2", "--restart-scope=replica",
             "--max-restarts=0", worker, backend, str(steps)],
            env,
        )  # fmt: skip
        results[backend] = (run.finish(time.monotonic() + DEADLINE_S), run.output())
    rc, out = results["default"]
    text = "\n".join(out)
    assert rc == 0, text
    for replica in (0, 1):
        assert f"replica {replica} committed {steps} of {steps}" in out, text
    assert not any("discarded" in line for line in out), text
    rc, out = results["nccl"]
    text = "\n".join(out)
    refused = [line for line in out if line.startswith("meshrun.ft: ")]
    assert rc == 2, f"exit {rc}\n{text}"
    # One line a worker (the second may be stopped before it gets there).
    assert 1 <= len(refused) <= 2 and len(set(refused)) == 1, text
    assert "backend 'nccl' needs CUDA" in refused[0], text
    assert not any(" committed " in line for line in out), text
    print(f"ok: no backend: {steps} of {steps} steps committed | nccl: {refused[0]}")


def case_finish_callback(args: argparse.Namespace) -> None:
    """The heal at the finishing quorum fails (the only group with the final
    state has a state_dict that raises): nobody left with the final state,
    so the run fails saying so, instead of every group ending with "nothing
    to do" and the run succeeding without its result."""
    rc, out = run_callback_worker(args, "finish")
    text = "\n".join(out)
    # The code of the failure that spent the budget (replica 0's refusal, exit
    # 1), not replica 1's SIGKILL of its first life.
    assert rc == 1, f"exit {rc}\n{text}"
    assert "replica 0 life 0 leaves at step 60" in out, text
    assert CALLBACK_RAISED in out, text
    lost = [line for line in out if line.startswith("meshrun.ft: step quorum: ")]
    assert (
        lost
        and (
            "the training state after 60 committed steps is lost: every replica group that "
            "finished with it failed before leaving"
        )
        in lost[0]
    ), text
    assert not any("run succeeded" in line for line in out), text
    print(f"ok: exit {rc} |", lost[0])


def case_straggler(args: argparse.Namespace) -> None:
    """Replica group 2 of 3 reaches every step's quorum about 30 ms after the
    others: the daemon's status page lists it as the slowest, /metrics has
    every group's lag, and the daemon logs it as a straggler once it was the
    last at most of a window of 100 quorums."""
    steps, slow = 130, 2
    deadline = time.monotonic() + DEADLINE_S
    daemon = Daemon(args.meshrun, deadline)
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ft_straggler_worker.py")
    env = dict(os.environ, PYTHON_EXEC=args.python, PYTHONPATH=args.pythonpath)
    run = Run(
        [
            args.meshrun,
            "--nnodes=1",
            "--nproc-per-node=3",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={daemon.endpoint}",
            "--rdzv-id=straggler",
            "--restart-scope=replica",
            "--replica-size=1",
            "--max-restarts=0",
            worker,
            str(steps),
            str(slow),
        ],
        env,
    )
    try:
        rc = run.finish(deadline)
        with urllib.request.urlopen(f"http://{daemon.metrics}/api/status", timeout=10) as reply:
            status = json.load(reply)
        with urllib.request.urlopen(f"http://{daemon.metrics}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
    finally:
        run.stop()
        daemon.stop()
    text = "\n".join(run.output())
    assert rc == 0, text
    (record,) = [r for r in status["runs"] if r["run_id"] == "straggler"]
    stragglers = record["stragglers"]
    assert stragglers and stragglers[0]["replica"] == slow, json.dumps(stragglers)
    first = stragglers[0]
    assert first["quorums"] >= steps and first["slowest"] >= 0.8 * first["quorums"], first
    assert first["mean_lag_ms"] >= 10, first
    lags = re.findall(
        r'^meshrun_replica_quorum_lag_seconds\{run="straggler",replica="(\d)"\} (\S+)$',
        metrics,
        re.M,
    )
    assert sorted(r for r, _ in lags) == ["0", "1", "2"], metrics
    logged = [line for line in daemon.output() if "a straggler" in line]
    assert logged and f"replica group {slow} was the last" in logged[0], daemon.output()
    said = logged[0].split("] ")[-1]
    print(
        f"ok: replica group {slow} {first['mean_lag_ms']} ms behind at the quorum, last at "
        f"{first['slowest']} of {first['quorums']}; logged: {said}"
    )


def case_torchft(args: argparse.Namespace) -> None:
    bench = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "recovery"
    )
    bindir = os.path.dirname(args.python)
    command = [
        args.python,
        os.path.join(bench, "torchft_launch.py"),
        "--groups=2",
        "--max-restarts=1",
        f"--meshrun={args.meshrun}",
        f"--lighthouse={os.path.join(bindir, 'torchft_lighthouse')}",
        "--",
        os.path.join(bench, "ft_python_recovery.py"),
        "--system=torchft",
        "--sizes=parity",
        "--steps=40",
        "--kill-at-step=15",
        "--kill-rank=1",
    ]
    run = Run(command, dict(os.environ, PYTHONUNBUFFERED="1"))
    rc = run.finish(time.monotonic() + DEADLINE_S)
    out = run.output()
    text = "\n".join(line for line in out if "torchft::" not in line)
    assert rc == 0, text[-6000:]
    started = [line for line in out if re.search(r"^rank \d pid \d+: replica", line)]
    assert len([line for line in started if line.startswith("rank 0 ")]) == 1, started
    assert any("replica 1 member 0 incarnation 1" in line for line in started), started
    assert "rank 1 SIGKILLs itself at step 15 (start)" in out, text[-6000:]
    assert "[meshrun] [warning] worker failed" in text, text[-6000:]
    healed = [
        line for line in out if re.search(r"replica 1 member 0 healed .* at step [1-9]", line)
    ]
    assert healed, text[-6000:]
    assert any(line.startswith("step 39 loss") for line in out), text[-6000:]
    print(f"ok: replica 1 restarted by its meshrun, {healed[0]}; replica 0 kept its pid")


def case_changes() -> None:
    for name, program in PROGRAMS.items():
        seed = open(os.path.join(SEEDS, program.seed)).read().splitlines()
        ft = open(os.path.join(SEEDS, program.ft)).read().splitlines()
        new = [
            line
            for line in difflib.unified_diff(seed, ft, lineterm="", n=0)
            if line.startswith("+")
            and not line.startswith(("+++", "+#"))
            and line[1:].strip()  # new comments and blank lines are not counted
        ]
        ft_lines = [line for line in new if line.rstrip().endswith("# meshrun.ft")]
        added = [line for line in new if re.search(r"# added\b", line)]
        assert len(ft_lines) == program.meshrun_ft_lines, (name, len(ft_lines))
        assert len(added) == program.added_lines, (name, len(added))
        assert len(new) == len(ft_lines) + len(added), (name, set(new) - set(ft_lines + added))
        print(f"ok: {name}: {len(ft_lines)} lines for meshrun.ft, {len(added)} added")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument(
        "case",
        choices=[
            *PROGRAMS,
            *("elastic", "scope", "callback", "finish_callback", "torchft", "changes"),
            *("straggler", "backend"),
        ],
    )
    args = parser.parse_args()
    sys.path[:0] = args.pythonpath.split(":")
    if args.case in PROGRAMS:
        case_kill(args, PROGRAMS[args.case])
    elif args.case == "elastic":
        case_elastic(args)
    elif args.case == "scope":
        case_scope(args)
    elif args.case == "callback":
        case_callback(args)
    elif args.case == "finish_callback":
        case_finish_callback(args)
    elif args.case == "backend":
        case_backend(args)
    elif args.case == "torchft":
        case_torchft(args)
    elif args.case == "straggler":
        case_straggler(args)
    else:
        case_changes()


if __name__ == "__main__":
    main()

"""Restart-free recovery for a PyTorch program (meshrun.ft) under meshrun.

Seed 002's DDP script with its meshrun.ft lines
(examples/seeds/002_ddp_elastic/train_script_ft.py) under
meshrun --restart-scope=replica: two replica groups of two workers, DDP
inside each group.

Cases:
  kill    a worker of replica 1 SIGKILLed mid-training: the run succeeds, the
          other group's workers keep their pids, the restarted group is
          healed (its record says restart 1), and every worker's final
          parameters equal a replay of the committed steps, each with the
          data of its participants only (the replay draws its batches with
          torch's own DistributedSampler, so the step-to-batch mapping is
          checked too).
  scope   the same script under --restart-scope=job: one line naming the
          flag, exit code 2 from every worker, and no step trained.
  changes the FT copy differs from the seed in exactly the lines marked
          "# meshrun.ft" (the number the README gives).

Usage: ft_python_test.py --meshrun BIN --python PY --pythonpath P CASE
"""

import argparse
import difflib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

SEED_DIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "seeds", "002_ddp_elastic"
)
SEED = os.path.join(SEED_DIR, "train_script.py")
SEED_FT = os.path.join(SEED_DIR, "train_script_ft.py")
DEADLINE_S = 240
CHANGED_LINES = 7  # README, "Restart-free recovery for PyTorch programs"

# The run: 4 workers, 2 replica groups of 2; 512 samples / 4 shards / batch 1
# = 128 steps an epoch, 3072 in all (about 5 ms a step here): the group
# killed after epoch 1 is back (about 4 s) long before the survivors finish,
# also on a loaded 2-core machine.
NPROC, REPLICA_SIZE, BATCH, EPOCHS = 4, 2, 1, 24


class Run:
    """One meshrun launch, its output collected; ended by its pid."""

    def __init__(self, args: argparse.Namespace, flags: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                args.meshrun,
                *flags,
                SEED_FT,
                "--batch_size",
                str(BATCH),
                "--max-epochs",
                str(EPOCHS),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def output(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for(self, pattern: str, deadline: float) -> bool:
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            if any(regex.search(line) for line in self.output()):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def finish(self, deadline: float) -> int:
        try:
            return self.proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return -1
        finally:
            self._reader.join(timeout=5)


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


def launch_env(args: argparse.Namespace, workdir: str, token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHON_EXEC=args.python,
        PYTHONPATH=args.pythonpath,
        TMPDIR=workdir,  # the seed's checkpoint goes to tempfile.gettempdir()
        FT_TEST_TOKEN=token,
        MESHRUN_FT_RECORD_DIR=workdir,
    )
    return env


def replay(history: list[list[int]]):
    """The committed steps in one process, each on its participants' data."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data.distributed import DistributedSampler

    sys.path.insert(0, SEED_DIR)
    import train_script  # the seed's model and data, as the workers build them

    torch.manual_seed(0)
    model = train_script.MyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = train_script.RandomDataset(512)
    samplers = [DistributedSampler(dataset, num_replicas=NPROC, rank=r) for r in range(NPROC)]
    per_epoch = len(samplers[0]) // BATCH
    for step, participants in enumerate(history):
        epoch, k = divmod(step, per_epoch)
        optimizer.zero_grad()
        shards = [p * REPLICA_SIZE + m for p in participants for m in range(REPLICA_SIZE)]
        for shard in shards:
            samplers[shard].set_epoch(epoch)
            batch = list(samplers[shard])[k * BATCH : (k + 1) * BATCH]
            x = torch.stack([dataset[i][0] for i in batch])
            y = torch.stack([dataset[i][1] for i in batch])
            (F.cross_entropy(model(x), y) / len(shards)).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


def load_records(workdir: str) -> list[dict]:
    import torch
    from meshrun import _state

    records = []
    for r in range(NPROC // REPLICA_SIZE):
        for m in range(REPLICA_SIZE):
            path = os.path.join(workdir, f"replica{r}_member{m}.pt")
            if not os.path.exists(path):
                raise AssertionError(f"no record from replica {r} member {m}")
            record = torch.load(path, weights_only=False)
            record["state"] = _state.unpack(record["state"], None)
            records.append(record)
    return records


def case_kill(args: argparse.Namespace) -> None:
    import torch

    token = uuid.uuid4().hex
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as workdir:
        run = Run(
            args,
            [
                "--standalone",
                f"--nproc-per-node={NPROC}",
                "--restart-scope=replica",
                f"--replica-size={REPLICA_SIZE}",
                "--max-restarts=3",
            ],
            launch_env(args, workdir, token),
        )
        try:
            # Mid-training: after the first epoch, well before the last.
            if not run.wait_for(r"epoch 1 loss", deadline):
                raise AssertionError("training never reached epoch 1")
            before = worker_pids(token)
            assert sorted(before) == list(range(NPROC)), before
            os.kill(before[2], signal.SIGKILL)  # replica 1, member 0
            rc = run.finish(deadline)
        finally:
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()
        out = run.output()
        if rc != 0:
            raise AssertionError(f"meshrun exited {rc}:\n" + "\n".join(out[-40:]))
        healed = [line for line in out if "healed from replica 0" in line]
        assert len(healed) == REPLICA_SIZE, "\n".join(out[-40:])
        records = load_records(workdir)
        steps = EPOCHS * (512 // NPROC // BATCH)
        expected = replay(records[0]["history"])
        for record in records:
            who = f"replica {record['replica']} member {record['member']}"
            assert record["steps"] == steps, f"{who}: {record['steps']} steps, not {steps}"
            assert record["history"] == records[0]["history"], f"{who}: another history"
            if record["replica"] == 0:
                rank = record["member"]
                assert record["pid"] == before[rank], f"{who}: a new pid (restarted)"
                assert record["incarnation"] == 0, who
            else:
                assert record["incarnation"] == 1, f"{who}: incarnation {record['incarnation']}"
            model = record["state"]["model"]
            for name, value in expected.items():
                got = model["module." + name]
                if not torch.allclose(got, value, rtol=1e-5, atol=1e-6):
                    diff = (got - value).abs().max().item()
                    raise AssertionError(f"{who}: {name} differs from the replay by {diff}")
        if os.environ.get("FT_TEST_VERBOSE"):
            print("\n".join(out))
        history = records[0]["history"]
        alone = sum(1 for h in history if h == [0])
        # Back before the end: it trained steps again, with the survivors.
        back = max(i for i, h in enumerate(history) if h == [0]) + 1
        assert 0 < alone and back < len(history), f"{alone} steps alone, back at {back}"
        print(
            f"ok: {steps} steps, {alone} by replica 0 alone, replica 1 healed "
            f"(pid {before[2]} killed); every worker equals the replay"
        )


def case_scope(args: argparse.Namespace) -> None:
    token = uuid.uuid4().hex
    deadline = time.monotonic() + DEADLINE_S
    with tempfile.TemporaryDirectory() as workdir:
        run = Run(
            args,
            ["--standalone", "--nproc-per-node=2", "--max-restarts=0"],
            launch_env(args, workdir, token),
        )
        rc = run.finish(deadline)
        out = run.output()
        errors = [line for line in out if line.startswith("meshrun.ft: ")]
        assert rc != 0, "\n".join(out)
        # The first worker's exit stops the other, which may not get to say it.
        assert errors and "--restart-scope=job" in errors[0], "\n".join(out)
        assert len(set(errors)) == 1, errors
        assert "exitcode  : 2" in "\n".join(out), "\n".join(out)
        assert not any("epoch" in line for line in out), "\n".join(out)
        print("ok:", errors[0])


def case_changes(args: argparse.Namespace) -> None:
    del args
    seed = open(SEED).read().splitlines()
    ft = open(SEED_FT).read().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(seed, ft, lineterm="", n=0)
        if line.startswith("+") and not line.startswith("+++") and not line.startswith("+#")
    ]
    marked = [line for line in ft if line.rstrip().endswith("# meshrun.ft")]
    assert len(changed) == len(marked) == CHANGED_LINES, (len(changed), len(marked))
    assert all(line.rstrip().endswith("# meshrun.ft") for line in changed), changed
    print(f"ok: {len(changed)} lines changed, each marked")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("case", choices=["kill", "scope", "changes"])
    args = parser.parse_args()
    sys.path[:0] = args.pythonpath.split(":")
    {"kill": case_kill, "scope": case_scope, "changes": case_changes}[args.case](args)


if __name__ == "__main__":
    main()

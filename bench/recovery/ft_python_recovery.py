#!/usr/bin/env python3
"""The recovery benchmark's Python restart-free setups
(bench/recovery/bench_recovery.py): the GPT of torch_ddp_recovery.py, four
replica groups of one worker, each training its quarter of the global batch,
SGD without momentum, gloo on CPU, with

  --system meshrun   meshrun.ft (python/meshrun), under
                     meshrun --standalone --nproc-per-node=4 --restart-scope=replica
  --system torchft   torchft 0.2.0's Manager, DistributedDataParallel and
                     Optimizer, as its README and train_ddp.py do: one torchrun
                     per replica group (REPLICA_GROUP_ID) and a torchft_lighthouse
                     (bench/recovery/torchft_launch.py starts them)

Both train the same steps on the same data (torch_ddp_recovery.batch_of: a
function of the step) and fail on the same schedule as train_example
--fault-tolerant (KillStep with replica groups of one): --kill-at-step F
(replica --kill-rank, default the last, in its first life) or --kill-every N
(failure j at step j * N, each replica in turn, at the first step from there
on that every replica takes part in; replica r's k-th restart met failure
k * 4 + r + 1). Lines, as train_example's fault-tolerant mode:

  rank R pid P: replica R member 0 incarnation I   (at start)
  step S: replicas 0,1,3   (meshrun.ft)  /  step S: 3 replicas  (torchft: its
      quorum names replica groups by string id; the reporter says how many)
  step S loss X            (the step's lowest participant; its own rows' loss,
                            so that neither side pays a collective for it)
  step S discarded: WHY    (meshrun.ft's own line; torchft: the reporter's)
  replica R member 0 healed from replica Q at step S
  rank R SIGKILLs itself at step S (start)

Exit codes: 0 done, 1 a failure, 2 bad flags.
"""

import argparse
import datetime
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "worker_lib", "models")]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt import Gpt, GptConfig  # noqa: E402
from torch_ddp_recovery import batch_of, layouts, say  # noqa: E402

# Four groups in the benchmark; torchft's launch says how many (its
# NUM_REPLICA_GROUPS), e.g. two in tests/e2e/ft_python_test.py.
REPLICAS = int(os.environ.get("NUM_REPLICA_GROUPS", "4"))


def kill_step(args: argparse.Namespace, replica: int, lives: int) -> int:
    """train_example's KillStep for fault-tolerant replicas of one worker."""
    if args.kill_every > 0:
        return args.kill_every * (lives * REPLICAS + replica + 1)
    if args.kill_at_step >= 0 and lives == 0 and replica == args.kill_rank:
        return args.kill_at_step
    return -1


def due(args: argparse.Namespace, step: int, dies_at: int, full: bool, last_partial: int) -> bool:
    """As train_example: --kill-every's failure strikes at the first step from
    its own on that every replica takes part in, once the failure before it
    has struck (a step without every replica since that one's planned step):
    one at a time, never while another is still coming back. --kill-at-step's
    at its step."""
    if dies_at < 0:
        return False
    if args.kill_every > 0:
        previous_struck = dies_at <= args.kill_every or last_partial >= dies_at - args.kill_every
        return step >= dies_at and full and previous_struck
    return step == dies_at


def rows(step: int, replica: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch_of(step, seed)
    n = layouts.BATCH // REPLICAS
    return x[replica * n : (replica + 1) * n], y[replica * n : (replica + 1) * n]


def start_together(replica: int) -> None:
    """torchft forms its first quorum with whoever is heartbeating (the
    Lighthouse's --min_replicas 1), and the four groups' interpreters start
    seconds apart: the first would train alone and the others heal into it.
    meshrun's first quorum waits for every group of the world. So that both
    train the same steps with the same replicas, torchft's groups start
    together: each waits, with its Manager up, until all are
    (TORCHFT_BENCH_BARRIER, a directory torchft_launch.py makes)."""
    barrier = os.environ["TORCHFT_BENCH_BARRIER"]
    open(os.path.join(barrier, f"ready{replica}"), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(barrier)) < REPLICAS:
        if time.monotonic() > deadline:
            raise SystemExit(
                f"ft_python_recovery: of {REPLICAS} replica groups only "
                f"{sorted(os.listdir(barrier))} started"
            )
        time.sleep(0.01)


def train_meshrun(args: argparse.Namespace) -> None:
    from meshrun import ft

    ft.init_process_group("gloo")
    replica = ft.replica_id()
    lives = int(os.environ.get("MESHRUN_REPLICA_RESTARTS", "0"))
    say(f"rank {replica} pid {os.getpid()}: replica {replica} member 0 incarnation {lives}")
    torch.manual_seed(args.seed)
    model = Gpt(GptConfig(**layouts.GPT))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    manager = ft.Manager.from_module(model, optimizer)
    optimizer = ft.Optimizer(manager, optimizer)
    if replica == 0 and lives == 0:
        say(f"layout meshrun.ft x {REPLICAS} (torch {torch.__version__})")
    dies_at = kill_step(args, replica, lives)
    last = None
    last_partial = -1  # the last step seen without every replica
    while True:
        optimizer.zero_grad()  # the step's quorum (and a heal)
        step = manager.current_step()
        if step >= args.steps:
            break
        participants = manager.participants()
        reports = replica == participants[0]
        if reports and participants != last:
            say(f"step {step}: replicas {','.join(map(str, participants))}")
            last = participants
        if len(participants) < REPLICAS:
            last_partial = step
        if due(args, step, dies_at, len(participants) == REPLICAS, last_partial):
            say(f"rank {replica} SIGKILLs itself at step {step} (start)")
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = rows(step, replica, args.seed)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        if optimizer.step() and reports:
            say(f"step {step} loss {loss.item():.9g}")
    manager.finish()


def train_torchft(args: argparse.Namespace) -> None:
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    replica = int(os.environ["REPLICA_GROUP_ID"])
    lives = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    say(f"rank {replica} pid {os.getpid()}: replica {replica} member 0 incarnation {lives}")
    torch.manual_seed(args.seed)
    model = Gpt(GptConfig(**layouts.GPT))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    timeout = datetime.timedelta(seconds=20)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"bench_{replica}",
        timeout=timeout,
        quorum_timeout=datetime.timedelta(seconds=30),
    )
    model = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optimizer)
    if lives == 0:
        start_together(replica)
    if replica == 0 and lives == 0:
        say(f"layout torchft x {REPLICAS} (torch {torch.__version__})")
    dies_at = kill_step(args, replica, lives)
    last = None
    last_partial = -1  # the last step seen without every replica
    while manager.current_step() < args.steps:
        before = manager.current_step()
        if due(args, before, dies_at, last == REPLICAS, last_partial):
            say(f"rank {replica} SIGKILLs itself at step {before} (start)")
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()  # starts the step's quorum (asynchronous)
        x, y = rows(before, replica, args.seed)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        n = manager.num_participants()
        reports = manager.participating_rank() == 0
        if n < REPLICAS:
            last_partial = before
        if reports and n != last:
            say(f"step {before}: {n} replicas")
        last = n
        optimizer.step()  # should_commit; a heal's state is applied here
        committed = manager.current_step() > before
        # torchft says it healed in its log only; its flag stays up until the
        # next quorum (the step count it received is the step trained).
        if manager._healing:
            healed_at = manager.current_step() - (1 if committed else 0)
            say(f"replica {replica} member 0 healed from replica ? at step {healed_at}")
        if committed and reports:
            say(f"step {before} loss {loss.item():.9g}")
        elif reports:
            say(f"step {before} discarded: torchft's should_commit said no")
    manager.shutdown(wait=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system", choices=["meshrun", "torchft"], required=True)
    parser.add_argument("--sizes", default="bench", choices=list(layouts.SIZES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=layouts.LR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--kill-rank", type=int, default=REPLICAS - 1)
    parser.add_argument("--kill-every", type=int, default=0)
    args = parser.parse_args()
    if args.kill_at_step >= 0 and args.kill_every > 0:
        print("ft_python_recovery: --kill-at-step or --kill-every, not both", file=sys.stderr)
        sys.exit(2)
    layouts.use_sizes(args.sizes)
    if args.system == "meshrun":
        train_meshrun(args)
    else:
        train_torchft(args)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as torch_ddp_recovery.py: no interpreter finalization under Gloo

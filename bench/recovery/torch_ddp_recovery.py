#!/usr/bin/env python3
"""PyTorch 2's side of the recovery benchmark (bench/recovery/bench_recovery.py):
DDP training of train_example's GPT, checkpointed with
torch.distributed.checkpoint (DCP) and resumed from it after torchrun
restarts every worker.

    torchrun --standalone --nproc-per-node=4 --max-restarts=1 \
        bench/recovery/torch_ddp_recovery.py --sizes bench --steps 40 \
        --checkpoint-dir /tmp/ckpt --checkpoint-every 10 --kill-at-step 25

The model is worker_lib/models/gpt.py (the Python twin of train_example's
torch::nn GPT, gpt.h) at tests/parity/layouts.py's sizes and global batch,
trained with DistributedDataParallel (gloo) and SGD without momentum, as
train_example trains it; each rank takes its contiguous quarter of the
global batch. Initial weights and data are this script's own (seeded), not
train_example's: the benchmark compares the cost of recovering, not losses.

Flags and output lines are train_example's (examples/cpp/train_example.cc),
so that one parser reads both:

- `--checkpoint-dir D --checkpoint-every C`: after every C steps (not after
  the last) every rank writes model + optimizer state (get_state_dict) with
  dcp.save to D/step-<N>.partial, N the steps done, which rank 0 renames to
  D/step-<N> once dcp.save has returned there (DCP writes its metadata last,
  after every rank's data), so a directory without the suffix is complete.
  On start the latest complete one is loaded (dcp.load + set_state_dict),
  rank 0 prints `resumed from the checkpoint after step N`, and training goes
  on with step N (steps count from 0).
- `--kill-at-step F [--kill-rank R]`: rank R (default the last) SIGKILLs
  itself at the start of step F in the first attempt only
  (TORCHELASTIC_RESTART_COUNT 0). Needs --checkpoint-dir.
- `--kill-every N`: the j-th failure (j = 1, 2, ...) strikes at the start of
  step j*N in attempt j - 1 (TORCHELASTIC_RESTART_COUNT), on rank
  world - 1 - (j - 1) mod world, as train_example's KillStep without
  --fault-tolerant.
- Just before dying: `rank R SIGKILLs itself at step S (start)`.
- Every step, rank 0: `step S loss X` (the global batch's mean loss, %.9g).
- Rank 0, once torch is imported: `torch imported` (the interpreter's and
  torch's start-up, for the benchmark's breakdown); once the process group
  and the model are set up: `layout DDP x WORLD (torch VERSION)`.

Exit codes: 0 done, 1 a failure, 2 bad flags.
"""

import argparse
import os
import re
import shutil
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "parity"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker_lib", "models"))

import layouts  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt import Gpt, GptConfig  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

CHECKPOINT_RE = re.compile(r"^step-(\d+)$")


def say(line):
    # One write a line: torchrun's workers share its stdout, and print()'s
    # separate write of the newline lets another rank's line in between.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def batch_of(step, seed):
    """The global batch of `step`: a function of (seed, step) only, so a
    restarted attempt trains step s on the same data as the first did. Token
    sequences mostly following an affine recurrence, as the parity data."""
    c = layouts.GPT
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    seq = torch.randint(0, c["vocab"], (layouts.BATCH, c["context"] + 1), generator=g)
    for t in range(1, c["context"] + 1):
        keep = torch.rand(layouts.BATCH, generator=g) < 0.9
        seq[:, t] = torch.where(keep, (seq[:, t - 1] * 5 + 3) % c["vocab"], seq[:, t])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def latest_checkpoint(directory):
    """The steps done at the newest complete checkpoint in `directory`, or 0."""
    steps = [int(m.group(1)) for m in map(CHECKPOINT_RE.match, os.listdir(directory)) if m]
    return max(steps, default=0)


def kill_step(args, rank, world, attempt):
    """The step at whose start this rank SIGKILLs itself in this attempt, or -1."""
    if args.kill_at_step >= 0:
        return args.kill_at_step if attempt == 0 and rank == args.kill_rank else -1
    if args.kill_every > 0:
        j = attempt + 1  # the failure this attempt suffers
        return j * args.kill_every if rank == world - 1 - (j - 1) % world else -1
    return -1


def main():
    if os.environ.get("RANK") == "0":
        say("torch imported")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default="bench",
        choices=list(layouts.SIZES),
        help="the GPT's sizes and the global batch (layouts.SIZES)",
    )
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--lr", type=float, default=layouts.LR, help="SGD learning rate")
    parser.add_argument("--seed", type=int, default=0, help="model and data seed")
    parser.add_argument("--checkpoint-dir", default="", help="DCP checkpoints here")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="a checkpoint after every this many steps"
    )
    parser.add_argument(
        "--kill-at-step",
        type=int,
        default=-1,
        help="rank --kill-rank SIGKILLs itself at this step (first attempt)",
    )
    parser.add_argument(
        "--kill-rank",
        type=int,
        default=-1,
        help="the rank --kill-at-step kills (default: the last)",
    )
    parser.add_argument(
        "--kill-every",
        type=int,
        default=0,
        help="the j-th failure at step j*N, one a restart attempt",
    )
    args = parser.parse_args()

    def bad_flags(why):
        print(f"torch_ddp_recovery: {why}", file=sys.stderr)
        sys.exit(2)

    if args.steps < 0 or args.checkpoint_every < 0 or args.kill_every < 0:
        bad_flags("--steps, --checkpoint-every and --kill-every take counts >= 0")
    if bool(args.checkpoint_dir) != (args.checkpoint_every > 0):
        bad_flags("--checkpoint-dir and --checkpoint-every go together")
    if (args.kill_at_step >= 0 or args.kill_every > 0) and not args.checkpoint_dir:
        bad_flags("--kill-at-step and --kill-every need --checkpoint-dir")
    if args.kill_at_step >= 0 and args.kill_every > 0:
        bad_flags("--kill-at-step or --kill-every, not both")
    layouts.use_sizes(args.sizes)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.kill_rank < 0:
        args.kill_rank = world - 1
    if layouts.BATCH % world:
        bad_flags(f"the global batch {layouts.BATCH} does not split over {world} ranks")

    torch.manual_seed(args.seed)
    model = DistributedDataParallel(Gpt(GptConfig(**layouts.GPT)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    if rank == 0:
        say(f"layout DDP x {world} (torch {torch.__version__})")

    first = 0
    if args.checkpoint_dir:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        # Rank 0's listing for everybody: one choice even if a directory
        # changed between two ranks' looks.
        choice = torch.tensor([latest_checkpoint(args.checkpoint_dir) if rank == 0 else 0])
        dist.broadcast(choice, 0)
        last = int(choice.item())
        if last > 0:
            model_state, optim_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=os.path.join(args.checkpoint_dir, f"step-{last}"))
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
            first = last
            if rank == 0:
                say(f"resumed from the checkpoint after step {last}")

    dies_at = kill_step(args, rank, world, attempt)
    rows = layouts.BATCH // world
    for step in range(first, args.steps):
        if step == dies_at:
            say(f"rank {rank} SIGKILLs itself at step {step} (start)")
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch_of(step, args.seed)
        x, y = x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        total = loss.detach().reshape(1).to(torch.float64) / world
        dist.all_reduce(total)
        if rank == 0:
            say(f"step {step} loss {total.item():.9g}")
        done = step + 1
        if args.checkpoint_every and done % args.checkpoint_every == 0 and done < args.steps:
            model_state, optim_state = get_state_dict(model, optimizer)
            partial = os.path.join(args.checkpoint_dir, f"step-{done}.partial")
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=partial)
            if rank == 0:
                final = os.path.join(args.checkpoint_dir, f"step-{done}")
                shutil.rmtree(final, ignore_errors=True)
                os.rename(partial, final)

    # No rank leaves while a peer may still be reading from it.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # No interpreter finalization: torch 2.15's Gloo threads may still drop a
    # finished work's tensors then, which aborts the process ("terminate
    # called without an active exception"; see examples/ddp_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

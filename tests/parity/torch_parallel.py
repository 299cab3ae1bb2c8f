"""PyTorch's side of the parity check (scripts/parity-torch.sh): trains the
MLP of meshrun's train_example (worker_lib/models/mlp.h) with PyTorch 2's
own parallelisms, from the same initial weights on the same batches, and
writes each step's loss and the final parameters.

    torchrun --standalone --nproc-per-node=4 tests/parity/torch_parallel.py \
        --layout fsdp --model mlp --init INIT_DIR --data DATA.pt --out OUT_DIR

The model mirrors mlp.h: Linears fc0, fc1, ... with a ReLU between each two,
parameters named as there ("fc0.weight"), the mean squared error. As
ModuleTrainer applies meshrun's parallelisms: the TP plan pairs Linears
column -> row-wise; fully_shard on every Linear and the root; pipeline
parts (a Linear and the ReLU after it) cut by layouts.cut_parts. The data
split mirrors ModuleTrainer: data-parallel rank i (dp-major, then fsdp)
takes the i-th contiguous block of rows; TP ranks share rows; pipeline
microbatches are contiguous chunks.

--sizes bench trains layouts.py's larger models; --time-steps times each
step as train_example --time-steps does (a barrier first; per step the
slowest rank) and prints `timing step_ms=... cpu_ms=... max_rss_mb=... rss_growth_mb=...`
on rank 0 (scripts/bench-parallel.sh --layouts).

Writes OUT_DIR/torch-rank<R>.pt ({"params": {name: full tensor}} from the
first rank of each pipeline stage, and "losses" on rank 0: each step's
global-batch mean loss). Layouts: tests/parity/layouts.py.
"""

import argparse
import glob
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.jit._pickle  # restore_type_tag, for meshrun checkpoints
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layouts  # noqa: E402

# --time-steps measures memory as the DDP / FSDP2 step benchmark does.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "worker_lib")
)
from ddp_step_bench import peak_rss_mb, rss_mb  # noqa: E402

# --- The model, as worker_lib/models/mlp.h builds it. ----------------------


class Layers(nn.Module):
    """A meshrun Sequential: layers applied in order, registered under the
    names meshrun gives their params. keep=(begin, end) keeps only those
    layers (a pipeline stage)."""

    def __init__(self, named_layers, keep=None):
        super().__init__()
        begin, end = keep or (0, len(named_layers))
        self.order = []
        for i, (name, layer) in enumerate(named_layers):
            if not begin <= i < end:
                continue
            parent = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    setattr(parent, part, nn.Module())
                parent = getattr(parent, part)
            setattr(parent, leaf, layer)
            self.order.append(name)

    def forward(self, x):
        for name in self.order:
            x = self.get_submodule(name)(x)
        return x


def make_layers(model="mlp"):
    """(name, module) per layer of mlp.h's MLP, in order."""
    if model != "mlp":
        raise ValueError(f"no model {model!r}: torch_gpt.py trains the GPT")
    sizes = layouts.MLP_SIZES
    named = []
    for i in range(len(sizes) - 1):
        if i > 0:
            named.append((f"act{i}", nn.ReLU()))
        named.append((f"fc{i}", nn.Linear(sizes[i], sizes[i + 1])))
    return named


def part_bounds(named, first, last):
    """The layers [begin, end) of parts [first, last]: part k is fc<k> and
    the ReLU after it (mlp.h's MlpStage)."""
    starts = [i for i, (name, _) in enumerate(named) if name.startswith("fc")]
    end = starts[last + 1] if last + 1 < len(starts) else len(named)
    return starts[first], end


def loss_of(output, target):
    return (output - target).pow(2).mean()


def load_meshrun_checkpoint(directory):
    """Full tensors by name from meshrun's sharded checkpoint (checkpoint.h:
    DIR/shard-*.pt, each a pickled list of (name, global shape, offsets,
    values))."""
    full = {}
    for path in sorted(glob.glob(os.path.join(directory, "shard-*.pt"))):
        # torch::pickle_save's typed lists and int lists.
        with torch.serialization.safe_globals(
            [torch.jit._pickle.restore_type_tag, torch.jit._pickle.build_intlist]
        ):
            entries = torch.load(path, weights_only=True)
        for name, shape, offsets, values in entries:
            t = full.setdefault(name, torch.zeros(shape, dtype=values.dtype))
            region = t
            for dim, (offset, size) in enumerate(zip(offsets, values.shape, strict=False)):
                region = region.narrow(dim, offset, size)
            region.copy_(values)
    return full


# --- Tensor parallelism, mirroring mlp.h's MlpTpPlan. -------------------------


def tp_plan(module):
    """fc<2i> column-wise, fc<2i+1> row-wise; an odd last Linear stays
    replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    names = {name for name, _ in module.named_modules()}
    linears = len(layouts.MLP_SIZES) - 1
    plan = {}
    for k in range(0, linears - 1, 2):
        plan[f"fc{k}"] = ColwiseParallel()
        plan[f"fc{k + 1}"] = RowwiseParallel()
    return {n: p for n, p in plan.items() if n in names}


# --- Training. -----------------------------------------------------------------


def full_value(t):
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def init_layout(layout, order):
    """The default group (Gloo) and `layout`'s mesh, its dims in `order`
    (those of size > 1): (mesh, rank, {dim: this rank's coordinate, 0 for
    the dims left out})."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != layout.world:
        raise SystemExit(f"{layout.name} needs {layout.world} ranks, got {world}")
    dims = [(n, getattr(layout, n)) for n in order if getattr(layout, n) > 1]
    mesh = init_device_mesh(
        "cpu", tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims)
    )
    coord = {n: 0 for n in order} | {n: mesh.get_local_rank(n) for n, _ in dims}
    return mesh, rank, coord


def print_timing(rank, step_ms, cpu_ms, rss_before_model):
    """train_example --time-steps' line on rank 0: per step the slowest rank
    and the ranks' CPU time summed, the largest rank's peak RSS and its growth
    over `rss_before_model`."""
    steps = len(step_ms)
    peak = peak_rss_mb()
    timing = torch.tensor(step_ms + [peak, peak - rss_before_model], dtype=torch.float64)
    dist.all_reduce(timing, op=dist.ReduceOp.MAX)
    cpu = torch.tensor(cpu_ms, dtype=torch.float64)
    dist.all_reduce(cpu)
    if rank == 0:
        print(
            f"timing step_ms={','.join(f'{t:.6f}' for t in timing[:steps].tolist())} "
            f"cpu_ms={','.join(f'{t:.6f}' for t in cpu.tolist())} "
            f"max_rss_mb={timing[steps].item():.1f} "
            f"rss_growth_mb={timing[steps + 1].item():.1f}",
            flush=True,
        )


def make_schedule(layout, modules, stage_ids, pp_group, loss_fn):
    """pipelining's stages for this rank's `modules` (global stages
    `stage_ids`) and the layout's schedule: (schedule, has_first, has_last)."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    num_stages = layout.pp * layout.virtual
    stages = [
        PipelineStage(m, s, num_stages, torch.device("cpu"), group=pp_group)
        for m, s in zip(modules, stage_ids, strict=True)
    ]
    if layout.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, layout.microbatches, loss_fn=loss_fn)
    else:
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[layout.schedule]
        schedule = kind(stages[0], layout.microbatches, loss_fn=loss_fn)
    return schedule, 0 in stage_ids, num_stages - 1 in stage_ids


def forward_backward(schedule, module, x, y, loss_fn, has_first, has_last):
    """One step's forward and backward, by `schedule` when pipelined; this
    rank's loss (0 where the last stage is not)."""
    if schedule is None:
        loss = loss_fn(module(x), y)
        loss.backward()
        return full_value(loss).item()
    mb_losses = []
    schedule.step(
        *([x] if has_first else []),
        target=y if has_last else None,
        losses=mb_losses if has_last else None,
    )
    return sum(full_value(mb).item() for mb in mb_losses) / len(mb_losses) if has_last else 0.0


def write_result(out_dir, rank, params, losses, writes):
    """OUT_DIR/torch-rank<R>.pt: {"params": params} (and "losses" on rank 0)
    where `writes` (each stage's first rank)."""
    out = {"params": params}
    if rank == 0:
        out["losses"] = losses
    if writes:
        os.makedirs(out_dir, exist_ok=True)
        torch.save(out, os.path.join(out_dir, f"torch-rank{rank}.pt"))


def add_run_args(parser):
    """The flags both torch sides take (this script and torch_gpt.py)."""
    parser.add_argument("--layout", required=True, choices=list(layouts.BY_NAME))
    parser.add_argument("--init", required=True, help="meshrun checkpoint directory")
    parser.add_argument("--data", required=True, help="batches file (list of (input, target))")
    parser.add_argument("--out", required=True, help="directory for torch-rank<R>.pt")
    parser.add_argument("--steps", type=int, default=0, help="0: every batch in --data")
    parser.add_argument(
        "--sizes",
        default="parity",
        choices=list(layouts.SIZES),
        help="model sizes and batch (layouts.SIZES)",
    )
    parser.add_argument(
        "--time-steps",
        action="store_true",
        help="time each step and print the times and peak RSS at the end",
    )


def load_initial_weights(module, directory):
    """`module`'s parameters from meshrun's checkpoint in `directory`, which
    must hold exactly its names."""
    init = load_meshrun_checkpoint(directory)
    names = set(dict(module.named_parameters()))
    if names != set(init):
        raise SystemExit(
            f"parameter names differ from the checkpoint's: {sorted(names ^ set(init))}"
        )
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(init[name])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(parser)
    parser.add_argument("--model", default="mlp", choices=["mlp"])
    parser.add_argument(
        "--trace-collectives",
        metavar="DIR",
        help="write the flight recorder's collectives before and after the "
        "steps to DIR/rank<R>.{before,after}.json",
    )
    args = parser.parse_args()
    layouts.use_sizes(args.sizes)
    layout = layouts.BY_NAME[args.layout]

    # Mesh dims as ModuleTrainer orders them.
    mesh, rank, coord = init_layout(layout, ("dp", "fsdp", "pp", "tp"))
    pp_rank, dp_rank, fsdp_rank, tp_rank = (coord[n] for n in ("pp", "dp", "fsdp", "tp"))
    rss_before_model = rss_mb()

    named = make_layers(args.model)
    whole = Layers(named)
    load_initial_weights(whole, args.init)

    # Pipeline stages: ModuleTrainer's CutParts over (pp x virtual) stages;
    # rank r holds stages r, r + pp, ... (the interleaved convention).
    stage_ids = [pp_rank]
    if layout.pp > 1:
        parts = layouts.cut_parts(len(layouts.MLP_SIZES) - 1, layout.pp * layout.virtual)
        stage_ids = [pp_rank + v * layout.pp for v in range(layout.virtual)]
        modules = [Layers(named, keep=part_bounds(named, *parts[s])) for s in stage_ids]
    else:
        modules = [whole]

    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        for m in modules:
            parallelize_module(m, mesh["tp"], tp_plan(m))
    if layout.fsdp > 1:
        from torch.distributed.fsdp import fully_shard

        fsdp_mesh = mesh["dp", "fsdp"] if layout.dp > 1 else mesh["fsdp"]
        for m in modules:
            for name in m.order:
                layer = m.get_submodule(name)
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=fsdp_mesh, reshard_after_forward=layout.reshard)
            fully_shard(m, mesh=fsdp_mesh, reshard_after_forward=layout.reshard)
    elif layout.dp > 1 and (layout.tp > 1 or layout.pp > 1):
        # DDP takes no DTensors; replicate() (FSDP2's DDP) does, and
        # pipelining knows it as an FSDPModule.
        from torch.distributed._composable.replicate_with_fsdp import replicate

        modules = [replicate(m, mesh=mesh["dp"]) for m in modules]
    elif layout.dp > 1:
        from torch.nn.parallel import DistributedDataParallel

        modules = [DistributedDataParallel(m) for m in modules]

    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=layouts.LR)

    schedule = None
    has_first = has_last = True
    if layout.pp > 1:
        schedule, has_first, has_last = make_schedule(
            layout,
            modules,
            stage_ids,
            mesh["pp"].get_group(),
            loss_of,
        )

    batches = torch.load(args.data, weights_only=True)
    steps = args.steps or len(batches)
    data_parts = layout.dp * layout.fsdp
    data_index = dp_rank * layout.fsdp + fsdp_rank
    # Every rank adds its local loss weighted so that the world's sum is the
    # global batch's mean: the data ranks' mean, counted once per TP group
    # and only where the loss is (the last pipeline stage).
    reports = tp_rank == 0 and has_last
    losses = []

    def dump_collectives(when):
        # As train_example --trace-collectives: the flight recorder's entries
        # before and after the steps.
        if not args.trace_collectives:
            return
        os.makedirs(args.trace_collectives, exist_ok=True)
        trace = torch._C._distributed_c10d._dump_fr_trace_json(True, False, "gloo")
        with open(os.path.join(args.trace_collectives, f"rank{rank}.{when}.json"), "wb") as f:
            f.write(trace if isinstance(trace, bytes) else trace.encode())

    dump_collectives("before")
    step_ms, cpu_ms = [], []
    for step in range(steps):
        x, y = batches[step]
        rows = x.shape[0] // data_parts
        x = x[data_index * rows : (data_index + 1) * rows]
        y = y[data_index * rows : (data_index + 1) * rows]
        if args.time_steps:
            dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        local = forward_backward(schedule, modules[0], x, y, loss_of, has_first, has_last)
        optimizer.step()
        total = torch.tensor([local / data_parts if reports else 0.0], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item())
        step_ms.append((time.perf_counter() - start) * 1e3)
        cpu_ms.append((time.process_time() - cpu_start) * 1e3)

    dump_collectives("after")
    if args.time_steps and steps:
        print_timing(rank, step_ms, cpu_ms, rss_before_model)

    # Full parameter values (collective), written by each stage's first rank.
    full = {}
    for m in modules:
        inner = m.module if isinstance(m, torch.nn.parallel.DistributedDataParallel) else m
        for name, p in inner.named_parameters():
            full[name] = full_value(p)
    write_result(args.out, rank, full, losses, dp_rank == 0 and fsdp_rank == 0 and tp_rank == 0)
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

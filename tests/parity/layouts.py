"""The layouts of the torch parity check (scripts/parity-torch.sh) and the
model each side trains, shared by parity.py (the driver) and
torch_parallel.py (PyTorch's side).

A layout names the parallel sizes (multiplying to the world), which PyTorch
API plays the control, and the pipeline schedule. The C++ side is
build/bin/train_example with the flags from cpp_flags() (model mlp: the
torch::nn MLP of worker_lib/models/mlp.h, whose PyTorch side is
tests/parity/torch_parallel.py), or build/bin/gpt_worker with gpt_flags()
(model gpt: the torch::nn GPT of worker_lib/models/gpt.h, whose PyTorch
side is tests/parity/torch_gpt.py on its Python twin).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    pp: int = 1
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    reshard: bool = True  # FSDP reshard_after_forward
    schedule: str = ""  # gpipe, 1f1b, interleaved (pp > 1)
    virtual: int = 1  # pipeline stages per rank (interleaved)
    microbatches: int = 1
    # What PyTorch uses, for the report.
    control: str = ""
    # The models it trains; why not the others.
    models: tuple = ("mlp", "gpt")
    skipped: str = ""

    @property
    def world(self):
        return self.pp * self.dp * self.fsdp * self.tp


LAYOUTS = [
    Layout("ddp", dp=4, control="DistributedDataParallel"),
    Layout("fsdp", fsdp=4, control="fully_shard per block + root"),
    Layout(
        "fsdp_noreshard", fsdp=4, reshard=False, control="fully_shard(reshard_after_forward=False)"
    ),
    Layout("hsdp", dp=2, fsdp=2, control="fully_shard on a (replicate, shard) mesh"),
    Layout("tp", tp=4, control="parallelize_module + loss_parallel"),
    Layout("fsdp_tp", fsdp=2, tp=2, control="parallelize_module on tp, fully_shard on dp"),
    Layout(
        "pp_gpipe", pp=4, schedule="gpipe", microbatches=8, control="PipelineStage + ScheduleGPipe"
    ),
    Layout(
        "pp_1f1b", pp=4, schedule="1f1b", microbatches=8, control="PipelineStage + Schedule1F1B"
    ),
    Layout(
        "pp_interleaved",
        pp=4,
        schedule="interleaved",
        virtual=2,
        microbatches=8,
        control="2 PipelineStages a rank + ScheduleInterleaved1F1B",
        models=("gpt",),
        skipped="mlp: its 4 Linear layers cannot fill 4 x 2 virtual stages",
    ),
    Layout(
        "dp_tp_pp",
        pp=2,
        dp=2,
        tp=2,
        schedule="1f1b",
        microbatches=4,
        control="parallelize_module + PipelineStage/Schedule1F1B + replicate",
    ),
]
BY_NAME = {layout.name: layout for layout in LAYOUTS}

# The models both sides train, and the global batch. Sizes divide by 4 (TP at
# 4).
# "parity": small, for the loss comparison; "bench": larger, so that a timed
# step (scripts/bench-parallel.sh --layouts) is more compute than overhead.
SIZES = {
    "parity": dict(
        mlp=[32, 64, 64, 64, 8],
        # The GPT: 6 blocks, so that its 8 parts (embeddings, blocks, the final
        # norm and head) fill 4 x 2 virtual pipeline stages.
        gpt=dict(vocab=64, context=8, dim=32, heads=4, layers=6),
        batch=32,
    ),
    "bench": dict(
        mlp=[256, 1024, 1024, 1024, 256],
        gpt=dict(vocab=256, context=32, dim=128, heads=4, layers=6),
        batch=32,
    ),
    # Small kernels, many units (32 Linears of width 64): the step is CPU
    # time around the operators (hooks, launches), which on a GPU decides the
    # step time of small-kernel models (issue 45).
    "narrow": dict(
        mlp=[64] * 33,
        gpt=dict(vocab=64, context=16, dim=64, heads=4, layers=16),
        batch=32,
    ),
}
MLP_SIZES = SIZES["parity"]["mlp"]
BATCH = SIZES["parity"]["batch"]
LR = 0.05

GPT = SIZES["parity"]["gpt"]
# The GPT trains with AdamW.
GPT_LR = 3e-3
GPT_WEIGHT_DECAY = 0.1


def use_sizes(name):
    """Makes MLP_SIZES, GPT and BATCH those of SIZES[name]."""
    global MLP_SIZES, GPT, BATCH
    MLP_SIZES = SIZES[name]["mlp"]
    GPT = SIZES[name]["gpt"]
    BATCH = SIZES[name]["batch"]


def cpp_flags(layout, model="mlp"):
    """train_example's flags for `layout` and `model` (mlp)."""
    if model != "mlp":
        raise ValueError(f"train_example's parity model is the MLP, not {model!r}")
    flags = ["--model", model, "--batch", str(BATCH), "--lr", str(LR)]
    flags += ["--sizes", ",".join(map(str, MLP_SIZES))]
    for dim in ("pp", "dp", "fsdp", "tp"):
        if getattr(layout, dim) > 1:
            flags += [f"--{dim}", str(getattr(layout, dim))]
    if not layout.reshard:
        flags.append("--no-reshard")
    if layout.pp > 1:
        flags += ["--schedule", layout.schedule, "--microbatches", str(layout.microbatches)]
        if layout.virtual > 1:
            flags += ["--virtual-stages", str(layout.virtual)]
    return flags


def gpt_flags(layout):
    """gpt_worker's flags for `layout` (its sizes follow from the world)."""
    flags = ["--layout", layout.name, "--microbatches", str(layout.microbatches)]
    for key, value in GPT.items():
        flags += [f"--{key}", str(value)]
    return flags


def cut_parts(parts, stages):
    """ModuleTrainer's CutParts: [first, last] parts of each stage, contiguous,
    the first parts % stages stages one part longer."""
    if stages > parts:
        raise ValueError(f"{stages} pipeline stages for {parts} parts")
    cut, first = [], 0
    for s in range(stages):
        count = parts // stages + (1 if s < parts % stages else 0)
        cut.append((first, first + count - 1))
        first += count
    return cut

#!/usr/bin/env python3
"""Step time of every parity layout: meshrun's C++ worker library vs PyTorch 2.

Run by `scripts/bench-parallel.sh --layouts`. For each layout of
tests/parity/layouts.py (ddp, fsdp, fsdp_noreshard, hsdp, tp, fsdp_tp,
pp_gpipe, pp_1f1b, pp_interleaved, dp_tp_pp) and each model it trains (the
torch::nn MLP, at layouts.SIZES[--sizes]; with --models gpt the torch::nn
GPT), trains the same model from the same initial weights on the same
batches with

  meshrun:  meshrun --standalone --no-python train_example --time-steps ...
            (gpt: gpt_worker --time-steps; both through ModuleTrainer)
  PyTorch:  meshrun --standalone --no-python PYTHON tests/parity/torch_parallel.py
            --time-steps ... (DDP, FSDP2, DTensor TP, pipelining; gloo)
            (gpt: tests/parity/torch_gpt.py --time-steps on the Python twin)

both launched by meshrun with OMP_NUM_THREADS=--threads, the two sides in
turn (who goes first rotates). Both time a step the same way: a barrier,
then zero_grad + forward + backward + gradient sync + SGD step + the global
loss's all-reduce; per step the slowest rank's wall time, and the CPU time
of all ranks together (every thread's: what the step costs the machine, and
on a GPU the launch time that bounds small-kernel steps). A launch's number
is the median of its steps after --warmup; over --rounds the median of
those.
Each side also reports its largest rank's peak RSS and that rank's growth
over its RSS before the model was built (Python's includes the interpreter
and torch's modules: compare growth). The two sides' losses are compared
as well (the largest relative difference over the steps): the same training.

--baseline PATH also runs another train_example (say, built before a change)
in the same turn ("baseline" columns); --meshrun-flags adds flags to
train_example's (both binaries), --baseline-flags to the baseline's only
(e.g. the same binary with an option switched off).

Stdlib and torch (the parity driver's data); progress on stderr, Markdown on
stdout.
"""

import argparse
import os
import re
import shlex
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PARITY = os.path.join(HERE, "..", "..", "tests", "parity")
sys.path.insert(0, PARITY)
import layouts  # noqa: E402
import parity  # noqa: E402

TIMING_RE = re.compile(
    r"^timing step_ms=(\S+) cpu_ms=(\S+) max_rss_mb=(\S+) rss_growth_mb=(\S+)$", re.M
)
LOSS_RE = re.compile(r"^step \d+ loss (\S+)$", re.M)
# Layouts whose memory goal is FSDP2's peak per rank.
SHARDED = {"fsdp", "fsdp_noreshard", "hsdp", "fsdp_tp"}


def log(*args):
    print("bench-parallel:", *args, file=sys.stderr, flush=True)


def bench_env(threads):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "MESHRUN_"))
        and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["OMP_NUM_THREADS"] = str(threads)
    return env


class Side:
    """One launch's numbers."""

    def __init__(self, output, warmup):
        m = TIMING_RE.search(output)
        if not m:
            raise parity.SideFailed(f"no timing line: {parity.first_error(output)}")
        self.steps = [float(v) for v in m.group(1).split(",")]
        self.cpu = [float(v) for v in m.group(2).split(",")]
        self.median = statistics.median(self.steps[warmup:] or self.steps)
        self.cpu_median = statistics.median(self.cpu[warmup:] or self.cpu)
        self.peak, self.growth = float(m.group(3)), float(m.group(4))


def launch(args, work, layout, model, side, init, data, raw):
    steps = args.warmup + args.steps
    tag = f"{layout.name}-{model}-{side}"
    cmd = [args.meshrun, "--standalone", f"--nproc-per-node={layout.world}", "--no-python"]
    if model == "gpt":
        script = os.path.join(PARITY, "torch_gpt.py")
        common = ["--init", init, "--data", data, "--steps", str(steps), "--time-steps"]
        if side == "torch":
            cmd += [args.python, script, "--layout", layout.name, "--sizes", args.sizes]
            cmd += ["--out", os.path.join(work, tag)] + common
        else:
            cmd += [args.gpt_worker, *layouts.gpt_flags(layout)] + common
    elif side != "torch":
        binary = args.baseline if side == "baseline" else args.train_example
        cmd += [
            binary,
            *layouts.cpp_flags(layout, model),
            "--steps",
            str(steps),
            "--data",
            data,
            "--load",
            init,
            "--time-steps",
            *shlex.split(args.meshrun_flags),
        ]
        if side == "baseline":
            cmd += shlex.split(args.baseline_flags)
    else:
        cmd += [
            args.python,
            os.path.join(PARITY, "torch_parallel.py"),
            "--layout",
            layout.name,
            "--model",
            model,
            "--sizes",
            args.sizes,
            "--init",
            init,
            "--data",
            data,
            "--out",
            os.path.join(work, tag),
            "--steps",
            str(steps),
            "--time-steps",
        ]
    t0 = time.perf_counter()
    try:
        output = parity.run(
            cmd, args.timeout, os.path.join(work, tag + ".log"), env=bench_env(args.threads)
        )
    finally:
        raw.append(f"$ {' '.join(cmd)}   # {time.perf_counter() - t0:.1f} s")
    result = Side(output, args.warmup)
    raw.append(
        f"{tag}: median_ms={result.median:.3f} max_rss_mb={result.peak} "
        f"rss_growth_mb={result.growth} step_ms="
        + ",".join(f"{t:.2f}" for t in result.steps)
        + " cpu_ms="
        + ",".join(f"{t:.2f}" for t in result.cpu)
    )
    if side != "torch":
        result.losses = [float(v) for v in LOSS_RE.findall(output)]
    else:
        import torch

        saved = torch.load(os.path.join(work, tag, "torch-rank0.pt"), weights_only=True)
        result.losses = saved["losses"]
    return result


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "layouts", nargs="*", help="LAYOUT or LAYOUT:MODEL (default: every parity layout)"
    )
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--train-example", required=True)
    parser.add_argument("--gpt-worker", help="build/bin/gpt_worker (model gpt)")
    parser.add_argument("--baseline", help="another train_example to time alongside")
    parser.add_argument("--meshrun-flags", default="", help="more train_example flags")
    parser.add_argument("--baseline-flags", default="", help="more flags for --baseline")
    parser.add_argument(
        "--python", default=sys.executable, help="runs torch_parallel.py (the venv's python3)"
    )
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--sizes", default="bench", choices=list(layouts.SIZES))
    parser.add_argument("--steps", type=int, default=20, help="timed steps a launch")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a launch")
    parser.add_argument("--raw", help="file for each launch's command and step times")
    parser.add_argument("--work", help="keep inputs and logs here")
    args = parser.parse_args()
    layouts.use_sizes(args.sizes)

    runs = []
    for arg in args.layouts or [layout.name for layout in layouts.LAYOUTS]:
        name, _, model = arg.partition(":")
        models = [model] if model else args.models.split(",")
        if name not in layouts.BY_NAME or not set(models) <= {"mlp", "gpt"}:
            parser.error(f"unknown layout or model: {arg}")
        if "gpt" in models and not args.gpt_worker:
            parser.error("model gpt needs --gpt-worker")
        runs += [(layouts.BY_NAME[name], m) for m in models if m in layouts.BY_NAME[name].models]

    work = args.work or tempfile.mkdtemp(prefix="meshrun-bench-layouts-")
    # Initial weights (train_example's) and batches, as the parity check makes them.
    prep = parity.Parity(
        argparse.Namespace(
            work=work,
            meshrun=args.meshrun,
            train_example=args.train_example,
            gpt_worker=args.gpt_worker,
            timeout=args.timeout,
            steps=args.warmup + args.steps,
        )
    )
    results = {(layout.name, m): {"meshrun": [], "torch": [], "baseline": []} for layout, m in runs}
    failures, raw = {}, []
    try:
        for r in range(args.rounds):
            for i, (layout, model) in enumerate(runs):
                if (layout.name, model) in failures:
                    continue
                init, data = prep.prepare(model)
                sides = ["meshrun", "torch"] + (["baseline"] if args.baseline else [])
                shift = (r + i) % len(sides)
                sides = sides[shift:] + sides[:shift]
                try:
                    for side in sides:
                        result = launch(args, work, layout, model, side, init, data, raw)
                        results[(layout.name, model)][side].append(result)
                        log(
                            f"round {r + 1}/{args.rounds} {layout.name} {model} {side}: "
                            f"{result.median:.2f} ms (CPU {result.cpu_median:.2f} ms), "
                            f"peak RSS {result.peak:.0f} MiB "
                            f"(+{result.growth:.0f})"
                        )
                except parity.SideFailed as e:
                    failures[(layout.name, model)] = f"{side}: {e}"
                    log(f"{layout.name} {model} {side} FAILED: {e}")
    finally:
        if args.raw:
            with open(args.raw, "w") as f:
                f.write("\n".join(raw) + "\n")

    g = layouts.GPT
    print(
        f'Models (layouts.SIZES["{args.sizes}"]): MLP '
        f"{','.join(map(str, layouts.MLP_SIZES))} (SGD); GPT vocab "
        f"{g['vocab']}, dim {g['dim']}, {g['heads']} heads, {g['layers']} blocks, context "
        f"{g['context']} (AdamW). Global "
        f"batch {layouts.BATCH}; {args.warmup} warm-up + {args.steps} timed steps a launch, "
        f"{args.rounds} round(s); OMP_NUM_THREADS={args.threads}."
    )
    print()
    print(
        "Ratio = meshrun / PyTorch median step time (at most 1.00: the goal met). "
        "CPU: the median step's CPU time, all ranks' threads together, ms, and its "
        "ratio. RSS: the largest rank's peak, and (growth) over its RSS before the model was "
        "built, MiB. Loss diff: largest relative difference of the two sides' per-step "
        "losses."
    )
    print()
    base_head = " baseline ms | baseline ratio | now / baseline |" if args.baseline else ""
    print(
        "| layout | world | model | PyTorch control | meshrun ms | PyTorch ms | ratio "
        "| meshrun CPU | PyTorch CPU | CPU ratio "
        "| meshrun RSS (growth) | PyTorch RSS (growth) | loss diff |" + base_head
    )
    print(
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|"
        + ("---:|---:|---:|" if args.baseline else "")
    )
    verdicts = []
    for layout, model in runs:
        key = (layout.name, model)
        if key in failures:
            print(
                f"| {layout.name} | {layout.world} | {model} | {layout.control} "
                f"| FAILED: {failures[key]} | | | | | | | | |"
            )
            verdicts.append(f"- {layout.name} {model}: FAILED ({failures[key]})")
            continue
        mine, theirs = results[key]["meshrun"], results[key]["torch"]
        ms = statistics.median(s.median for s in mine)
        ts = statistics.median(s.median for s in theirs)
        mc = statistics.median(s.cpu_median for s in mine)
        tc = statistics.median(s.cpu_median for s in theirs)
        peak = statistics.median(s.peak for s in mine)
        growth = statistics.median(s.growth for s in mine)
        tpeak = statistics.median(s.peak for s in theirs)
        tgrowth = statistics.median(s.growth for s in theirs)
        base_cells = ""
        if args.baseline:
            bs = statistics.median(s.median for s in results[key]["baseline"])
            base_cells = f" {bs:.2f} | {bs / ts:.2f} | {ms / bs:.2f} |"
        diff = max(
            (abs(a - b) / abs(b) if b else abs(a))
            for a, b in zip(mine[-1].losses, theirs[-1].losses, strict=False)
        )
        print(
            f"| {layout.name} | {layout.world} | {model} | {layout.control} | {ms:.2f} "
            f"| {ts:.2f} | {ms / ts:.2f} | {mc:.2f} | {tc:.2f} | {mc / tc:.2f} "
            f"| {peak:.0f} ({growth:.1f}) "
            f"| {tpeak:.0f} ({tgrowth:.1f}) | {diff:.1g} |" + base_cells
        )
        verdicts.append(
            f"- {layout.name} {model}: meshrun / PyTorch = {ms / ts:.2f} "
            f"({'MET' if ms <= ts else 'NOT MET'}), CPU {mc / tc:.2f}"
            + (
                f"; RSS growth {growth:.1f} vs FSDP2's {tgrowth:.1f} MiB "
                f"({'MET' if growth <= tgrowth else 'NOT MET'})"
                if layout.name in SHARDED
                else ""
            )
        )
    print()
    print("### Verdicts: at most 1.0x PyTorch's step time; FSDP layouts' memory at most FSDP2's")
    print()
    print("\n".join(verdicts))
    if failures:
        print(f"inputs and logs in {work}", file=sys.stderr)
    elif not args.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

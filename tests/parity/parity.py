"""Golden parity of meshrun's C++ parallel training with PyTorch 2's own
parallelisms (scripts/parity-torch.sh; issue 16).

For each layout (tests/parity/layouts.py) and model (the torch::nn MLP of
train_example and the torch::nn GPT of gpt_worker),
trains the same model from the same initial weights on the same batches
twice:

  control:  torchrun --standalone tests/parity/torch_parallel.py (DDP, FSDP2,
            DTensor TP, torch.distributed.pipelining), torch_gpt.py for gpt
  compared: meshrun --standalone --no-python train_example --data --load --save,
            gpt_worker --data --init --out for gpt

and prints one line per layout, `LAYOUT max_rel_diff=X`, X the largest of the
per-step losses' relative differences and the final parameters' relative
errors (norm of the difference / norm of the control's, per tensor) over
both models. Exits 1 when any X exceeds --tolerance (or a side fails, which
the line says), 2 for bad arguments.

The initial weights are train_example's own (world 1, --steps 0 --save) or
gpt_worker's (--save-init), which the torch side reads; the batches are made
here and written with torch.save, which both C++ programs read with --data.
"""

import argparse
import collections
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import torch
import torch.jit._pickle  # restore_type_tag, for the C++ side's pickles

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layouts  # noqa: E402
from torch_parallel import load_meshrun_checkpoint  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class SideFailed(Exception):
    pass


def run(cmd, timeout, log_path, env=None):
    """Runs `cmd` in its own process group with a deadline; the whole group is
    ended (by the leader's pid) when it runs over. Returns its output."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
            rc = None
    output = open(log_path, errors="replace").read()
    if rc != 0:
        why = f"timed out after {timeout} s" if rc is None else f"exit {rc}"
        raise SideFailed(f"{why}: {first_error(output)} (log {log_path})")
    return output


def first_error(output):
    """The line of `output` that best says what went wrong."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for pattern in (
        r"^\[rank\d+\]: \w*(Error|Exception)\b",
        r"\b\w*(Error|Exception): ",
        r"train_example rank",
        r"not expected|schedule",
        r"\berror\b(?!_file)",
        r"unknown|invalid|fail",
    ):
        for line in lines:
            if re.search(pattern, line, re.IGNORECASE):
                return line[:400]
    return lines[-1][:400] if lines else "(no output)"


def make_batches(model, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        if model == "mlp":
            x = torch.randn(layouts.BATCH, layouts.MLP_SIZES[0], generator=g)
            # A fixed nonlinear function plus noise: learnable, like SyntheticBatch.
            w = torch.linspace(-1, 1, layouts.MLP_SIZES[0] * layouts.MLP_SIZES[-1]).view(
                layouts.MLP_SIZES[0], layouts.MLP_SIZES[-1]
            )
            y = torch.sin(x) @ w / 4 + 0.01 * torch.randn(
                layouts.BATCH, layouts.MLP_SIZES[-1], generator=g
            )
        else:
            c = layouts.GPT
            seq = torch.randint(0, c["vocab"], (layouts.BATCH, c["context"] + 1), generator=g)
            # Mostly the affine recurrence of SyntheticTokens, so there is
            # something to learn.
            for t in range(1, c["context"] + 1):
                keep = torch.rand(layouts.BATCH, generator=g) < 0.9
                seq[:, t] = torch.where(keep, (seq[:, t - 1] * 5 + 3) % c["vocab"], seq[:, t])
            x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        batches.append((x, y))
    return batches


DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Half": 2,
    "BFloat16": 2,
    "Bool": 1,
    "Byte": 1,
    "Char": 1,
    "Short": 2,
}


def count_collectives(trace_dir, steps):
    """Per step and rank (mean over ranks): how many collectives of each
    kind, and the bytes handed to them (inputs; receives count nothing, their
    sends count), from the flight-recorder dumps DIR/rank<R>.{before,after}.json:
    the entries of "after" that "before" does not hold."""
    ops, nbytes, ranks = collections.Counter(), 0, 0

    def entries(path):
        with open(path) as f:
            return json.load(f).get("entries", [])

    for name in os.listdir(trace_dir):
        if not name.endswith(".after.json"):
            continue
        ranks += 1
        seen = {
            (e["pg_id"], e["record_id"])
            for e in entries(os.path.join(trace_dir, name.replace(".after.", ".before.")))
        }
        for e in entries(os.path.join(trace_dir, name)):
            if (e["pg_id"], e["record_id"]) in seen:
                continue
            kind = e["profiling_name"].split(":", 1)[-1]
            ops[kind] += 1
            if "recv" not in kind:
                for shape, dtype in zip(e["input_sizes"], e["input_dtypes"], strict=False):
                    nbytes += math.prod(shape) * DTYPE_BYTES.get(dtype, 4)
    scale = 1 / (ranks * steps) if ranks else 0
    return {k: v * scale for k, v in ops.items()}, nbytes * scale


def describe_collectives(ops, nbytes):
    kinds = ", ".join(f"{k} {v:.4g}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    return f"{sum(ops.values()):.4g} ops {nbytes / 1024:.1f} KiB [{kinds}]"


def rel(a, b):
    a, b = a.double(), b.double()
    scale = b.norm().item()
    diff = (a - b).norm().item()
    return diff / scale if scale else diff


def read_outputs(directory):
    """The parameters (by name, over every *-rank<R>.pt) and rank 0's
    per-step losses that gpt_worker --out or torch_gpt.py wrote."""
    params, losses = {}, None
    allowed = [torch.jit._pickle.restore_type_tag, torch.jit._pickle.build_doublelist]
    with torch.serialization.safe_globals(allowed):
        for name in sorted(os.listdir(directory)):
            saved = torch.load(os.path.join(directory, name), weights_only=True)
            params.update(saved["params"])
            losses = saved.get("losses", losses)
    if losses is None:
        raise SideFailed(f"no losses in {directory}")
    return params, [float(v) for v in losses]


def max_difference(cpp_losses, torch_losses, cpp_params, torch_params):
    """(the largest relative difference of the losses and the parameters,
    where it is); raises SideFailed when the names or step counts differ."""
    if set(cpp_params) != set(torch_params):
        raise SideFailed(f"parameter names differ: {sorted(set(cpp_params) ^ set(torch_params))}")
    if len(cpp_losses) != len(torch_losses):
        raise SideFailed(f"{len(cpp_losses)} losses against torch's {len(torch_losses)}")
    worst, where = 0.0, ""
    for step, (got, want) in enumerate(zip(cpp_losses, torch_losses, strict=True)):
        d = abs(got - want) / abs(want) if want else abs(got)
        if not d <= worst:
            worst, where = d, f"loss of step {step} ({got:.9g} vs {want:.9g})"
    for name, want in torch_params.items():
        got = cpp_params[name]
        d = rel(got, want) if got.shape == want.shape else math.inf
        if not d <= worst:
            worst, where = d, name
    return worst, where


class Parity:
    def __init__(self, args):
        self.args = args
        self.work = args.work or tempfile.mkdtemp(prefix="meshrun-parity-")
        os.makedirs(self.work, exist_ok=True)
        self.prepared = {}
        # The flight recorder keeps the last TORCH_FR_BUFFER_SIZE collectives.
        self.env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="1000000")
        self.collectives = []  # lines for the report

    def launch_cpp(self, world, flags, log):
        a = self.args
        cmd = [
            a.meshrun,
            "--standalone",
            f"--nproc-per-node={world}",
            "--no-python",
            a.train_example,
        ] + flags
        return run(cmd, a.timeout, log, env=self.env)

    def prepare(self, model):
        """Initial weights (train_example's, world 1; gpt_worker's) and the
        batches file."""
        if model in self.prepared:
            return self.prepared[model]
        init = os.path.join(self.work, f"init-{model}")
        log = os.path.join(self.work, f"init-{model}.log")
        if model == "gpt":
            flags = layouts.gpt_flags(layouts.Layout("single")) + ["--save-init", init]
            run([self.args.gpt_worker] + flags, self.args.timeout, log, env=self.env)
        else:
            flags = layouts.cpp_flags(layouts.Layout("single"), model) + [
                "--steps",
                "0",
                "--save",
                init,
            ]
            self.launch_cpp(1, flags, log)
        data = os.path.join(self.work, f"data-{model}.pt")
        torch.save(make_batches(model, self.args.steps), data)
        self.prepared[model] = (init, data)
        return init, data

    def compare_gpt(self, layout):
        """max_rel_diff of one layout on the GPT: torch_gpt.py against
        gpt_worker; raises SideFailed."""
        a = self.args
        init, data = self.prepare("gpt")
        cpp_out = os.path.join(self.work, f"cpp-{layout.name}-gpt")
        torch_out = os.path.join(self.work, f"torch-{layout.name}-gpt")
        common = ["--init", init, "--data", data, "--steps", str(a.steps)]
        cmd = [
            a.torchrun,
            "--standalone",
            f"--nproc-per-node={layout.world}",
            os.path.join(HERE, "torch_gpt.py"),
            "--layout",
            layout.name,
            "--out",
            torch_out,
        ] + common
        try:
            run(cmd, a.timeout, torch_out + ".log", env=self.env)
        except SideFailed as e:
            raise SideFailed(f"torch: {e}") from e
        cmd = (
            [
                a.meshrun,
                "--standalone",
                f"--nproc-per-node={layout.world}",
                "--no-python",
                a.gpt_worker,
            ]
            + layouts.gpt_flags(layout)
            + common
            + ["--out", cpp_out]
        )
        try:
            run(cmd, a.timeout, cpp_out + ".log", env=self.env)
        except SideFailed as e:
            raise SideFailed(f"meshrun: {e}") from e
        cpp_params, cpp_losses = read_outputs(cpp_out)
        torch_params, torch_losses = read_outputs(torch_out)
        return max_difference(cpp_losses, torch_losses, cpp_params, torch_params)

    def compare(self, layout, model):
        """max_rel_diff of one layout and model; raises SideFailed."""
        if model == "gpt":
            return self.compare_gpt(layout)
        a = self.args
        init, data = self.prepare(model)
        tag = f"{layout.name}-{model}"
        cpp_out = os.path.join(self.work, f"cpp-{tag}")
        torch_out = os.path.join(self.work, f"torch-{tag}")
        # The control first: a layout meshrun cannot run yet still shows
        # whether PyTorch can.
        cmd = [
            a.torchrun,
            "--standalone",
            f"--nproc-per-node={layout.world}",
            os.path.join(HERE, "torch_parallel.py"),
            "--layout",
            layout.name,
            "--model",
            model,
            "--init",
            init,
            "--data",
            data,
            "--out",
            torch_out,
            "--steps",
            str(a.steps),
            "--trace-collectives",
            torch_out + "-collectives",
        ]
        try:
            run(cmd, a.timeout, torch_out + ".log", env=self.env)
        except SideFailed as e:
            raise SideFailed(f"torch: {e}") from e

        flags = layouts.cpp_flags(layout, model) + [
            "--steps",
            str(a.steps),
            "--data",
            data,
            "--load",
            init,
            "--save",
            cpp_out,
            "--trace-collectives",
            cpp_out + "-collectives",
        ]
        try:
            cpp_log = self.launch_cpp(layout.world, flags, cpp_out + ".log")
        except SideFailed as e:
            raise SideFailed(f"meshrun: {e}") from e
        cpp_losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", cpp_log, re.M)]
        if len(cpp_losses) != a.steps:
            raise SideFailed(f"meshrun printed {len(cpp_losses)} losses, not {a.steps}")
        if layout.pp > 1:
            self.check_stages(layout, model, cpp_log)

        torch_params, torch_losses = {}, None
        for name in sorted(os.listdir(torch_out)):
            saved = torch.load(os.path.join(torch_out, name), weights_only=True)
            torch_params.update(saved["params"])
            torch_losses = saved.get("losses", torch_losses)
        cpp_params = load_meshrun_checkpoint(cpp_out)
        cpp_counts = count_collectives(cpp_out + "-collectives", a.steps)
        torch_counts = count_collectives(torch_out + "-collectives", a.steps)
        self.collectives.append(
            f"  {model}: meshrun {describe_collectives(*cpp_counts)}"
            f"; torch {describe_collectives(*torch_counts)}"
            + (
                "; pipeline sends/receives not counted (gloo's flight recorder does not "
                "record point-to-point ops)"
                if layout.pp > 1
                else ""
            )
        )

        return max_difference(cpp_losses, torch_losses, cpp_params, torch_params)

    def check_stages(self, layout, model, cpp_log):
        """The torch side cuts the model where meshrun does (rank 0's first
        stage)."""
        m = re.search(r"rank 0 holds stage 0/\d+: parts \[(\d+), (\d+)\]", cpp_log)
        if not m:
            raise SideFailed("meshrun did not say which parts rank 0's stage holds")
        want = layouts.cut_parts(len(layouts.MLP_SIZES) - 1, layout.pp * layout.virtual)[0]
        if (int(m.group(1)), int(m.group(2))) != want:
            raise SideFailed(
                f"meshrun's stage 0 holds parts [{m.group(1)}, {m.group(2)}], "
                f"the torch side's [{want[0]}, {want[1]}]"
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "layouts",
        nargs="*",
        help="LAYOUT or LAYOUT:MODEL (default: all of "
        + ", ".join(layout.name for layout in layouts.LAYOUTS)
        + ")",
    )
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--train-example", required=True)
    parser.add_argument("--torchrun", required=True)
    parser.add_argument("--gpt-worker", help="build/bin/gpt_worker (model gpt)")
    parser.add_argument("--models", default="mlp,gpt")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=300, help="seconds a run")
    parser.add_argument("--work", help="keep inputs, outputs and logs here")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--collectives",
        action="store_true",
        help="also print each side's collectives per step and rank",
    )
    args = parser.parse_args()
    runs = []  # (layout name, models, whether the layout cannot train some asked for)
    for arg in args.layouts or [layout.name for layout in layouts.LAYOUTS]:
        name, _, model = arg.partition(":")
        models = [model] if model else args.models.split(",")
        if name not in layouts.BY_NAME or not set(models) <= {"mlp", "gpt"}:
            parser.error(f"unknown layout or model: {arg}")
        if "gpt" in models and not args.gpt_worker:
            parser.error("model gpt needs --gpt-worker")
        kept = [m for m in models if m in layouts.BY_NAME[name].models]
        runs.append((name, kept, kept != models))

    parity = Parity(args)
    failed = False
    for name, models, dropped in runs:
        layout = layouts.BY_NAME[name]
        if not models:
            print(f"{name} skipped ({layout.skipped})", flush=True)
            continue
        started = time.monotonic()
        parts, worst = [], 0.0
        try:
            for model in models:
                d, where = parity.compare(layout, model)
                parts.append(f"{model} {d:.2g}" + (f" at {where}" if args.verbose else ""))
                worst = max(worst, d)
        except SideFailed as e:
            failed = True
            print(f"{name} FAILED ({', '.join(parts + [model])}): {e}", flush=True)
            continue
        if dropped:
            parts.append(layout.skipped)
        bad = not worst <= args.tolerance
        failed |= bad
        print(
            f"{name} max_rel_diff={worst:.3g} ({', '.join(parts)}; "
            f"world {layout.world}, {layout.control}; {time.monotonic() - started:.0f} s)"
            + (f" > {args.tolerance:g}" if bad else ""),
            flush=True,
        )
        if args.collectives:
            print("\n".join(parity.collectives), flush=True)
        parity.collectives.clear()
    if args.work or failed:  # the logs the failures name stay
        print(f"inputs, outputs and logs in {parity.work}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(parity.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

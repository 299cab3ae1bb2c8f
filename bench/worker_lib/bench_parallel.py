#!/usr/bin/env python3
"""Training-step time at world 4: meshrun's DP, FSDP, DP x TP vs PyTorch DDP / FSDP2.

Run by scripts/bench-parallel.sh; stdlib only. Progress goes to stderr; the
result tables (Markdown) and a verdict go to stdout.

Every launch is `meshrun --standalone --nproc-per-node=N` of either
`--no-python dp_step_bench --mode M` (meshrun's C++ DP / FSDP) or
`ddp_step_bench.py --mode M` (PyTorch DDP or FSDP2's fully_shard, torch 2 run
by --python, gloo), with the same MLP sizes, global batch and step count. Each
launch reports the median over its timed steps of the per-step time (max over
ranks) and the largest rank's peak RSS. The implementations alternate within a
round (rotating who goes first); over --rounds rounds the reported number is
the median of the launch medians.

--baseline PATH adds, for each meshrun mode in --baseline-impls, the same mode
run by another dp_step_bench binary (say, one built from the commit before a
change), interleaved with the others, so before and after are measured in the
same machine state.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

# Rank 0's line (meshrun and torchrun 2 print it unprefixed unless tee'd).
RESULT_RE = re.compile(r"RESULT (impl=.*)$", re.M)
TORCH_MODES = ("ddp", "fsdp2", "fsdp2_noreshard")
BASELINE_SUFFIX = "@baseline"
LABEL = {
    "ddp": "PyTorch DDP",
    "fsdp2": "PyTorch FSDP2",
    "fsdp2_noreshard": "PyTorch FSDP2 (no reshard)",
    "module_ddp": "meshrun DDP (torch::nn)",
    "module_fsdp": "meshrun FSDP (torch::nn)",
    "module_fsdp_noreshard": "meshrun FSDP (torch::nn, no reshard)",
    "module_dptp": "meshrun DDP x TP (torch::nn)",
}
# The PyTorch peer each meshrun mode is compared with besides DDP.
PEER = {
    "module_ddp": "ddp",
    "module_fsdp": "fsdp2",
    "module_fsdp_noreshard": "fsdp2_noreshard",
}


def label(impl):
    if impl.endswith(BASELINE_SUFFIX):
        return LABEL.get(impl[: -len(BASELINE_SUFFIX)], impl) + ", baseline"
    return LABEL.get(impl, impl)


def peer(impl):
    return PEER.get(impl.removesuffix(BASELINE_SUFFIX))


def log(*args):
    print("bench-parallel:", *args, file=sys.stderr, flush=True)


def bench_env(python):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "MESHRUN_"))
        and k
        not in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["PYTHON_EXEC"] = python
    return env


def launch(args, impl, sizes, raw):
    common = [
        f"--sizes={sizes}",
        f"--batch={args.batch}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
    ]
    launcher = [args.meshrun, "--standalone", f"--nproc-per-node={args.world}", "--no-python"]
    if impl in TORCH_MODES:
        cmd = [*launcher, args.python, args.ddp_script, f"--mode={impl}", *common]
    elif impl.endswith(BASELINE_SUFFIX):
        cmd = [*launcher, args.baseline, f"--mode={impl[: -len(BASELINE_SUFFIX)]}", *common]
    else:
        cmd = [*launcher, args.dp_step_bench, f"--mode={impl}", *common]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env=bench_env(args.python),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=args.launch_timeout,
    )
    wall = time.perf_counter() - t0
    raw.append(f"$ {' '.join(cmd)}   # exit {proc.returncode}, {wall:.1f} s")
    results = RESULT_RE.findall(proc.stdout)
    for line in proc.stdout.splitlines():
        if "RESULT impl=" in line or "STEPS impl=" in line:
            raw.append(line)
    if not results:
        raw.append(proc.stdout[-3000:])
        raise RuntimeError(f"{impl} failed (exit {proc.returncode}); see the raw output")
    if proc.returncode != 0:
        # Measured, then failed on the way out (torch 2.15's FSDP2 on gloo
        # sometimes aborts in teardown, "terminate called without an active
        # exception", after its RESULT line): keep the measurement, say so.
        raw.append(proc.stdout[-3000:])
        log(f"{impl} exited {proc.returncode} after its RESULT line; kept (raw output has it)")
    fields = dict(kv.split("=", 1) for kv in results[-1].split())
    return float(fields["median_ms"]), fields


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--dp-step-bench", required=True)
    parser.add_argument("--ddp-script", required=True)
    parser.add_argument(
        "--python",
        default=os.environ.get("PYTHON_EXEC", sys.executable),
        help="runs ddp_step_bench.py (default $PYTHON_EXEC, else this Python)",
    )
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument(
        "--models",
        default="50,50,50,50,4;256,1024,1024,1024,256",
        help="MLP sizes, ';' between models",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--impls",
        default="module_ddp,ddp,module_fsdp,fsdp2,module_fsdp_noreshard,fsdp2_noreshard,module_dptp",
    )
    parser.add_argument("--baseline", help="another dp_step_bench binary to compare with")
    parser.add_argument("--baseline-impls", default="module_ddp,module_fsdp,module_fsdp_noreshard")
    parser.add_argument("--launch-timeout", type=float, default=300)
    parser.add_argument("--raw", help="file for the raw RESULT/STEPS lines")
    args = parser.parse_args()

    impls = args.impls.split(",")
    if args.baseline:
        impls += [i + BASELINE_SUFFIX for i in args.baseline_impls.split(",")]
    models = args.models.split(";")
    raw = []
    medians = {(m, i): [] for m in models for i in impls}
    # Per launch: the largest rank's peak RSS and its growth over the RSS
    # before the model was built (MiB), where the binary reports them.
    memory = {(m, i): [] for m in models for i in impls}
    try:
        for r in range(args.rounds):
            for model in models:
                order = impls[r % len(impls) :] + impls[: r % len(impls)]
                for impl in order:
                    median, fields = launch(args, impl, model, raw)
                    medians[(model, impl)].append(median)
                    if "max_rss_mb" in fields:
                        memory[(model, impl)].append(
                            (float(fields["max_rss_mb"]), float(fields["rss_growth_mb"]))
                        )
                    log(f"round {r + 1}/{args.rounds} model {model} {impl}: {median:.3f} ms")
    finally:
        if args.raw:
            with open(args.raw, "w") as f:
                f.write("\n".join(raw) + "\n")

    verdicts = []
    for model in models:
        params = 0
        sizes = [int(s) for s in model.split(",")]
        for a, b in zip(sizes, sizes[1:], strict=False):
            params += a * b + b
        print(
            f"### MLP {model} ({params} params, {params * 4 / 1e6:.2f} MB of fp32 grads), "
            f"global batch {args.batch}, world {args.world}"
        )
        print()
        print(
            "Median step time over rounds (each round: one launch per implementation, "
            f"median of its {args.steps} timed steps, each step the slowest rank). "
            "Ratio = implementation / PyTorch DDP, and meshrun FSDP / PyTorch FSDP2 with "
            "the same reshard_after_forward (below 1: faster). Peak RSS: the largest "
            "rank's, median over launches; growth: over its RSS before the model was "
            'built ("-": not reported by that binary).'
        )
        print()
        print(
            "| implementation | median ms | launches (ms) | ratio vs DDP | ratio vs FSDP2 "
            "| peak RSS MiB | RSS growth MiB |"
        )
        print("|---|---:|---|---:|---:|---:|---:|")
        med_of = {i: statistics.median(medians[(model, i)]) for i in impls}
        ddp = med_of.get("ddp")
        for impl in impls:
            med = med_of[impl]
            ratio = f"{med / ddp:.2f}" if ddp else "-"
            versus = f"{med / med_of[peer(impl)]:.2f}" if peer(impl) in med_of else "-"
            launches = ", ".join(f"{v:.2f}" for v in medians[(model, impl)])
            mem = memory[(model, impl)]
            rss = f"{statistics.median(p for p, _ in mem):.1f}" if mem else "-"
            growth = f"{statistics.median(g for _, g in mem):.1f}" if mem else "-"
            print(
                f"| {label(impl)} | {med:.3f} | {launches} | {ratio} | {versus} | {rss} "
                f"| {growth} |"
            )
        print()
        for impl in impls:
            base = impl + BASELINE_SUFFIX
            if base in med_of:
                verdicts.append(
                    f"- MLP {model}: {label(impl)} now / baseline = "
                    f"{med_of[impl] / med_of[base]:.2f}"
                )
            if peer(impl) in med_of and not impl.endswith(BASELINE_SUFFIX):
                verdicts.append(
                    f"- MLP {model}: {label(impl)} / {label(peer(impl))} = "
                    f"{med_of[impl] / med_of[peer(impl)]:.2f} "
                    f"({'MET' if med_of[impl] <= med_of[peer(impl)] else 'NOT MET'})"
                )
    print("### Verdicts: meshrun DP no slower than PyTorch DDP, meshrun FSDP no slower than FSDP2")
    print()
    print("\n".join(verdicts))


if __name__ == "__main__":
    main()

"""Seed 003's TP + PP function as a training loop, for bench/ray/bench_ray.py.

Each step is one call of the seed's own ``func()`` (2d_parallelism_cpu.py:
its Linear layers, TP pairs [0, 1] and [2, 3], PP [0, 2], gloo), with the
lines it prints swallowed. After each step every rank appends
``<rank> <step> <unix time> <pid> <node>`` to the marks file, where the
benchmark reads when training started and when it came back after a node
died. The ranks stop together once the stop file exists (a MAX all-reduce of
whether each sees it, so that none leaves the others in a collective).

The same function runs under Ray Train (``train(config)`` as TorchTrainer's
train_loop_per_worker, the process group set up by Ray) and as a script
under ``meshrun --ray`` (``seed003_train.py MARKS STOP``).
"""

import contextlib
import importlib.util
import io
import os
import sys
import time

import torch
import torch.distributed as dist

SEED = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "..", "examples", "seeds", "003_tp_pp", "2d_parallelism_cpu.py",
)  # fmt: skip


def seed_func():
    spec = importlib.util.spec_from_file_location("seed003", SEED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines Linear and func; runs nothing
    return module.func


def node_name() -> str:
    """The Ray node this rank runs on (its id's first 8 characters)."""
    label = os.environ.get("MESHRUN_NODE_LABEL", "")  # meshrun --ray: "ray-<id8>"
    if label.startswith("ray-"):
        return label[4:12]
    import ray

    return ray.get_runtime_context().get_node_id()[:8]


def train(config: dict[str, str]) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    func = seed_func()
    rank, node = dist.get_rank(), node_name()
    with open(config["marks"], "a") as marks:
        for step in range(1_000_000):
            with contextlib.redirect_stdout(io.StringIO()):
                func()
            marks.write(f"{rank} {step} {time.time():.6f} {os.getpid()} {node}\n")
            marks.flush()
            stop = torch.tensor([float(os.path.exists(config["stop"]))])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break


if __name__ == "__main__":
    train({"marks": sys.argv[1], "stop": sys.argv[2]})
    dist.destroy_process_group()

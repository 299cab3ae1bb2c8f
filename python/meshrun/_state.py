"""A heal's payload: the training state as bytes, and back.

The state is whatever the program's state_dict callback returns (nested
dicts and lists of tensors and plain values: a module's and an optimizer's
state dicts). A DTensor (FSDP2's parameters and optimizer state) travels as
its local shard with its placements: the source and the receiver are the
same member of their replica groups, so they hold the same shard, and the
receiver wraps it on its own mesh.
"""

import io
import sys
from typing import Any

import torch


def _dtensor_class() -> type | None:
    """DTensor once the program has imported it (FSDP2 and TP do): only then
    can its state hold one, and importing it here would cost every worker's
    start about half a second."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


class _LocalShard:
    def __init__(self, tensor: Any) -> None:  # a DTensor
        self.local = tensor.to_local().detach().cpu()
        self.placements = tuple(tensor.placements)
        self.shape = tuple(tensor.shape)
        self.stride = tuple(tensor.stride())


def _map(value: Any, fn) -> Any:
    if isinstance(value, dict):
        return type(value)((k, _map(v, fn)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map(v, fn) for v in value)
    return fn(value)


def _find_mesh(value: Any):
    dtensor = _dtensor_class()
    if dtensor is None:
        return None
    found = []

    def visit(v: Any) -> Any:
        if isinstance(v, dtensor) and not found:
            found.append(v.device_mesh)
        return v

    _map(value, visit)
    return found[0] if found else None


def pack(state: Any) -> bytes:
    dtensor = _dtensor_class()

    def to_plain(v: Any) -> Any:
        if dtensor is not None and isinstance(v, dtensor):
            return _LocalShard(v)
        if isinstance(v, torch.Tensor):
            return v.detach().cpu()
        return v

    buffer = io.BytesIO()
    torch.save(_map(state, to_plain), buffer)
    return buffer.getvalue()


def unpack(data: bytes, own_state: Any) -> Any:
    """`own_state`: the receiver's current state (its mesh for DTensors)."""
    # weights_only=False: the bytes come from this job's own replica, over its
    # process group, and carry the program's own state (any picklable value).
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    mesh = _find_mesh(own_state)

    def to_own(v: Any) -> Any:
        if isinstance(v, _LocalShard):
            if mesh is None:
                raise RuntimeError("the state holds DTensors but this replica's has none")
            from torch.distributed.tensor import DTensor

            return DTensor.from_local(
                v.local.to(mesh.device_type),
                mesh,
                v.placements,
                run_check=False,
                shape=torch.Size(v.shape),
                stride=v.stride,
            )
        return v  # load_state_dict copies to the parameters' device

    return _map(state, to_own)

"""A heal's payload: the training state as a skeleton and its tensors.

The state is whatever the program's state_dict callback returns (nested
dicts and lists of tensors and plain values: a module's and an optimizer's
state dicts). A heal sends it in two parts: the skeleton, the state with
every tensor replaced by a meta tensor of its shape and dtype (small: no
data), saved with torch.save and loaded with ``weights_only=True``, so that
bytes from the network never run code; and the tensors' bytes, one tensor
(or chunk) at a time, received into tensors the receiver allocates from the
skeleton. Neither side makes a copy of the whole state.

A DTensor (FSDP2's parameters and optimizer state) travels as its local
shard with its placements (as plain values): the source and the receiver are
the same member of their replica groups, so they hold the same shard, and
the receiver wraps it on its own mesh.
"""

import io
import pickle
import sys
from collections.abc import Callable
from typing import Any

import torch


class RefusedState(Exception):
    """A heal's skeleton that a weights-only load refuses (it would have to
    construct an object, i.e. run code, to load): one line."""


def _dtensor_class() -> type | None:
    """DTensor once the program has imported it (FSDP2 and TP do): only then
    can its state hold one, and importing it here would cost every worker's
    start about half a second."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


class _LocalShard:
    """A DTensor in a record (MESHRUN_FT_RECORD_DIR), which the test reads."""

    def __init__(self, tensor: Any) -> None:  # a DTensor
        self.local = tensor.to_local().detach().cpu()
        self.placements = tuple(tensor.placements)
        self.shape = tuple(tensor.shape)
        self.stride = tuple(tensor.stride())


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
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


def record_bytes(state: Any) -> bytes:
    """The state as one torch.save (a worker's record of its own state)."""
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


def _placement_to_plain(p: Any) -> tuple:
    name = type(p).__name__
    if name == "Shard":
        return ("shard", p.dim)
    if name == "_StridedShard":
        return ("strided_shard", p.dim, p.split_factor)
    if name == "Replicate":
        return ("replicate",)
    if name == "Partial":
        return ("partial", p.reduce_op)
    raise TypeError(f"a DTensor placement a heal cannot carry: {p!r}")


def _placement_from_plain(p: tuple) -> Any:
    from torch.distributed.tensor import Partial, Replicate, Shard

    kind = p[0]
    if kind == "shard":
        return Shard(p[1])
    if kind == "strided_shard":
        from torch.distributed.tensor.placement_types import _StridedShard

        return _StridedShard(p[1], split_factor=p[2])
    if kind == "replicate":
        return Replicate()
    if kind == "partial":
        return Partial(p[1])
    raise RefusedState(f"an unknown DTensor placement {kind!r}")


def split(state: Any) -> tuple[bytes, list[torch.Tensor]]:
    """(skeleton, tensors): the tensors in the skeleton's order, each the
    source's own (a DTensor's local shard; no copy where it is contiguous)."""
    dtensor = _dtensor_class()
    tensors: list[torch.Tensor] = []
    dtensors: dict[int, tuple] = {}
    on_cpu: list[int] = []  # where the receiver keeps them too (Adam's step)

    def to_meta(v: Any) -> Any:
        if dtensor is not None and isinstance(v, dtensor):
            dtensors[len(tensors)] = (
                [_placement_to_plain(p) for p in v.placements],
                list(v.shape),
                list(v.stride()),
            )
            v = v.to_local()
        elif not isinstance(v, torch.Tensor):
            return v
        t = v.detach()
        if type(t) is not torch.Tensor:
            t = t.as_subclass(torch.Tensor)
        if t.layout != torch.strided:
            raise TypeError(f"a {t.layout} tensor in the state: a heal carries dense tensors")
        if t.device.type == "cpu":
            on_cpu.append(len(tensors))
        tensors.append(t.resolve_conj().resolve_neg().contiguous())
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    buffer = io.BytesIO()
    torch.save({"tree": _map(state, to_meta), "dtensors": dtensors, "cpu": on_cpu}, buffer)
    return buffer.getvalue(), tensors


def load_skeleton(data: bytes) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, its meta tensors in order). Raises RefusedState when the
    bytes hold anything but tensors and plain values."""
    try:
        skeleton = torch.load(io.BytesIO(data), map_location="meta", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        why = next((line for line in lines if "global" in line.lower()), lines[-1] if lines else "")
        raise RefusedState(f"weights_only load: {why}") from None
    except Exception as e:
        raise RefusedState(f"unreadable: {type(e).__name__}: {e}") from None
    if not isinstance(skeleton, dict) or set(skeleton) != {"tree", "dtensors", "cpu"}:
        raise RefusedState("not a heal's skeleton")
    metas: list[torch.Tensor] = []

    def visit(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            metas.append(v)
        return v

    _map(skeleton["tree"], visit)
    return skeleton, metas


def nbytes(meta: torch.Tensor) -> int:
    return meta.numel() * meta.element_size()


def join(skeleton: Any, tensors: list[torch.Tensor], own_state: Any) -> Any:
    """The state: the skeleton with its tensors (received in its order).
    `own_state`: the receiver's current state (its mesh for DTensors)."""
    dtensors = skeleton["dtensors"]
    mesh = _find_mesh(own_state) if dtensors else None
    position = iter(range(len(tensors)))

    def fill(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        i = next(position)
        if i not in dtensors:
            return tensors[i]
        if mesh is None:
            raise RuntimeError("the state holds DTensors but this replica's has none")
        from torch.distributed.tensor import DTensor

        placements, shape, stride = dtensors[i]
        return DTensor.from_local(
            tensors[i].to(mesh.device_type),
            mesh,
            [_placement_from_plain(tuple(p)) for p in placements],
            run_check=False,
            shape=torch.Size(shape),
            stride=tuple(stride),
        )

    return _map(skeleton["tree"], fill)

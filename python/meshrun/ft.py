"""Restart-free recovery for PyTorch programs, over meshrun's step quorum.

What torchft gives a training loop, with meshrun's daemon as the lighthouse
(replicated by its --state-dir, and the one that already sees every failure)
and meshrun's agent restarting only the failed replica group
(``meshrun --restart-scope=replica --replica-size=N``). A DDP program gains
it with a handful of changed lines::

    from meshrun import ft

    ft.init_process_group()         # the default group: this replica group
    model = DDP(MyModel())          # DDP (or FSDP2) inside the replica group
    optimizer = optim.SGD(model.parameters(), lr=1e-3)
    manager = ft.Manager.from_module(model, optimizer)
    optimizer = ft.Optimizer(manager, optimizer)
    loader = DataLoader(data, batch_size=32, sampler=ft.DistributedSampler(data, 32))
    for epoch in range(loader.sampler.start_epoch, epochs):
        for x, y in loader:                  # the step's batch, by its number
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()                 # applied only if every group's step commits
    ft.destroy_process_group()               # heals groups still restarting, then ends

Each step: every member of every live replica group arrives at the daemon's
quorum, which names the participants. Their replica dimension (member m of
each participant) is reconfigured when they change. A participant that is
behind (a restarted group, one that missed steps) gets the training state of
the most advanced one: what the state_dict callback returns, the committed
step count (and with it the data position: ft.DistributedSampler serves
batches by step) and the history of participants. After backward, the
gradients are averaged over the participants in one all-reduce per dtype;
every member votes, and the optimizer steps only when the daemon says the
step commits. A step a failure interrupts is discarded everywhere and trained
again by the survivors, who keep their processes.
"""

import datetime
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Dataset, Sampler

from meshrun import _state
from meshrun._daemon import DaemonClient, DaemonError, Quorum
from meshrun._errors import UsageError
from meshrun._identity import IdentityError, ReplicaIdentity, identity_from_env
from meshrun._replica_group import ReplicaDimension

__all__ = [
    "DistributedDataParallel",
    "DistributedSampler",
    "Manager",
    "Optimizer",
    "UsageError",
    "destroy_process_group",
    "init_process_group",
    "replica_id",
]

_manager: "Manager | None" = None


def _my_identity() -> ReplicaIdentity:
    """This worker's identity, or the program's one-line exit (code 2)."""
    try:
        return identity_from_env(os.environ)
    except IdentityError as e:
        raise UsageError(str(e)) from None


def _log(line: str) -> None:
    print(f"meshrun.ft: {line}", file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _tcp_store(identity: ReplicaIdentity, timeout: datetime.timedelta) -> dist.TCPStore:
    """A client of the workers' store (MASTER_ADDR/MASTER_PORT: meshrun's
    agent relay or daemon), which outlives any one replica group."""
    return dist.TCPStore(
        identity.master_addr,
        identity.master_port,
        is_master=False,
        timeout=timeout,
        wait_for_workers=False,
    )


def _default_group_backend(backend: str | None, cuda: bool) -> str:
    """The backend init_process_group passes torch: no backend picks by the
    device as torch does (Gloo for CPU tensors, and NCCL for CUDA ones where
    there is CUDA); NCCL without CUDA is refused."""
    if backend is None:
        return "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if "nccl" in backend and not cuda:
        raise UsageError(
            f"backend {backend!r} needs CUDA, and this process has none "
            "(torch.cuda.is_available() is False): pass 'gloo', or no backend to pick by device"
        )
    return backend


def _replica_backend(requested: str | None, default_group: str | None, cuda: bool) -> str:
    """The replica dimension's backend: the one asked for, else NCCL where
    the default group (`default_group`: its backend config, e.g.
    'cpu:gloo,cuda:nccl'; None: not made) reaches CUDA tensors over it, else
    Gloo. A request the process or the default group contradicts is refused."""
    if requested is None:
        if default_group is None:
            return "nccl" if cuda else "gloo"
        return "nccl" if cuda and "nccl" in default_group else "gloo"
    if requested not in ("gloo", "nccl"):
        raise UsageError(f"Manager(backend={requested!r}): the replica dimension is gloo or nccl")
    if requested == "nccl" and not cuda:
        raise UsageError(
            "Manager(backend='nccl') needs CUDA, and this process has none "
            "(torch.cuda.is_available() is False): pass 'gloo', or no backend"
        )
    if requested == "nccl" and default_group is not None and "nccl" not in default_group:
        raise UsageError(
            f"Manager(backend='nccl') disagrees with the default group's {default_group!r}: "
            "the model's tensors are not on CUDA there; pass 'gloo', or no backend"
        )
    return requested


def init_process_group(
    backend: str | None = None, timeout: datetime.timedelta | None = None
) -> None:
    """torch.distributed.init_process_group for this replica group alone.

    The default group's ranks are the group's members (0..replica_size-1):
    DDP, FSDP2 and barriers inside a group go over it, so that another
    group's failure never reaches them. Its keys are this incarnation's
    (a restarted group never meets its predecessor's). No `backend` picks
    by device, as torch does: Gloo, and NCCL for CUDA tensors where there is
    CUDA.
    """
    identity = _my_identity()
    backend = _default_group_backend(backend, torch.cuda.is_available())
    timeout = timeout or datetime.timedelta(minutes=10)
    store = dist.PrefixStore(identity.store_prefix, _tcp_store(identity, timeout))
    dist.init_process_group(
        backend,
        store=store,
        rank=identity.member,
        world_size=identity.replica_size,
        timeout=timeout,
    )


def replica_id() -> int:
    """This worker's replica group (its name in quorums and logs)."""
    return _my_identity().replica


def destroy_process_group() -> None:
    """Ends the training as torch.distributed.destroy_process_group does,
    first waiting at a last quorum for groups that are restarting, so that
    they leave with the final state too (Manager.finish)."""
    if _manager is not None:
        _manager.finish()
    if dist.is_initialized():
        dist.destroy_process_group()


class Manager:
    """One per process: the replica group's part in each step's quorum.

    ``state_dict`` returns the training state a heal copies (the model's and
    the optimizer's state dicts, anything else the program keeps);
    ``load_state_dict`` applies a received one. With ``init_sync`` the first
    quorum is joined here, so that a restarted group is healed (and knows
    its step) before its loop starts.
    """

    def __init__(
        self,
        state_dict: Callable[[], Any],
        load_state_dict: Callable[[Any], None],
        *,
        quorum_timeout: datetime.timedelta = datetime.timedelta(seconds=30),
        timeout: datetime.timedelta = datetime.timedelta(seconds=20),
        backend: str | None = None,
        init_sync: bool = True,
    ) -> None:
        global _manager
        if _manager is not None:
            raise UsageError("a process has one Manager; this one already made its own")
        self._id = _my_identity()
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        # The daemon's wait for missing groups, at the quorum and at the vote.
        self._quorum_timeout = quorum_timeout.total_seconds()
        self._daemon = DaemonClient(self._id)
        default_group = dist.get_backend_config() if dist.is_initialized() else None
        backend = _replica_backend(backend, default_group, torch.cuda.is_available())
        # The replica group's own agreement goes over the default group: a
        # CPU flag unless it has no CPU backend.
        self._group_device = (
            torch.device("cuda", torch.cuda.current_device())
            if default_group is not None and "cpu:" not in default_group
            else torch.device("cpu")
        )
        # A store client of its own, not init_process_group's: a TCPStore's
        # timeout is per client, and a replica group's rendezvous gives up
        # after `timeout` while the process group waits its own (10 minutes).
        self._replicas = ReplicaDimension(self._id, _tcp_store(self._id, timeout), backend, timeout)
        self._step = 0  # steps committed
        self._history: list[list[int]] = []  # each committed step's participants
        self._quorum: Quorum | None = None  # the step in progress
        self._discard_reason = ""
        self._finished = False
        _manager = self
        if init_sync:
            try:
                self.start_step()
            except _TrainingOver as e:
                _exit_training_over(e)

    @classmethod
    def from_module(cls, model: nn.Module, optimizer: torch.optim.Optimizer, **kwargs: Any):
        """A Manager whose heals copy `model`'s and `optimizer`'s state."""

        def state_dict() -> dict[str, Any]:
            return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

        def load_state_dict(state: dict[str, Any]) -> None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])

        return cls(state_dict, load_state_dict, **kwargs)

    # What the program can ask.
    @property
    def replica_id(self) -> int:
        return self._id.replica

    def current_step(self) -> int:
        """Steps committed: the step trained next."""
        return self._step

    def participants(self) -> list[int]:
        """The replica groups taking part in the step in progress."""
        return list(self._quorum.participants) if self._quorum else []

    def num_participants(self) -> int:
        return len(self._quorum.participants) if self._quorum else 0

    @property
    def step_in_progress(self) -> bool:
        """A quorum was joined and the step not yet voted."""
        return self._quorum is not None

    @property
    def history(self) -> list[list[int]]:
        """Each committed step's participants, in order (copied by a heal)."""
        return self._history

    # The step.
    def start_step(self) -> int:
        """Joins the next step's quorum (once per step: again while it is in
        progress returns the same step); heals when someone is behind.
        Returns the step to train."""
        if self._finished:
            raise UsageError("a step started after destroy_process_group()")
        while self._quorum is None:
            quorum = self._arrive(finished=False)
            if self._id.replica in quorum.participants:
                self._begin(quorum)
            # else: arrived late; the next quorum has us
        return self._step

    def reduce_and_vote(self, tensors: Iterable[torch.Tensor | None]) -> bool:
        """Averages `tensors` (the gradients) in place over the step's
        participants and votes; True when the step commits (the caller
        applies it). False: discarded; the tensors are then undefined."""
        if self._quorum is None:
            raise UsageError(
                "a step voted without a quorum: call optimizer.zero_grad() (or "
                "Manager.start_step()) before backward"
            )
        return self._vote([t for t in tensors if t is not None], train=True)

    def _vote(self, tensors: list[torch.Tensor], train: bool) -> bool:
        quorum, self._quorum = self._quorum, None
        flats = _flatten_by_dtype(tensors)
        ok = train and self._replicas.group is not None
        reason = self._discard_reason or ("not trained" if not train else "")
        if ok:
            try:
                for flat in flats.values():
                    self._replicas.allreduce(flat)
            except Exception as e:
                ok, reason = False, _first_line(e)
                self._replicas.fail()
        commit, why_not = self._daemon.commit(quorum.quorum_id, ok, self._quorum_timeout)
        if commit and not self._group_agrees(True):
            commit, why_not = False, "another member of this replica group was told to discard"
        elif not commit and self._id.replica_size > 1:
            self._group_agrees(False)
        if not commit:
            self._discard_reason = ""
            # One line a step: the lowest participant's first member says it.
            reports = self._id.member == 0 and self._id.replica == quorum.participants[0]
            if train and reports:
                _log(f"step {self._step} discarded: {reason or why_not}")
            return False
        self._discard_reason = ""
        n = len(quorum.participants)
        for flat in flats.values():
            flat.div_(n)
        _unflatten(flats, tensors)
        self._step += 1
        self._history.append(list(quorum.participants))
        return True

    def finish(self) -> None:
        """Waits at a last quorum for groups that are restarting (up to the
        quorum timeout) and heals them to the final state, then leaves."""
        if self._finished:
            return
        if self._quorum is not None:
            self._vote([], train=False)  # a step begun and not trained: voted down
        try:
            quorum = self._arrive(finished=True)
            if self._id.replica in quorum.participants:
                self._begin(quorum)
                self._quorum = None
        except _TrainingOver:
            pass  # healed by the others' last quorum; they have left
        self._finished = True
        self._record()
        self._daemon.close()

    # Inside.
    def _arrive(self, finished: bool) -> Quorum:
        try:
            return self._daemon.quorum(self._step, self._quorum_timeout, finished)
        except DaemonError as e:
            if e.code.name == "OUT_OF_RANGE":
                raise _TrainingOver(str(e)) from None
            # E.g. DATA_LOSS: every group that held the state is gone.
            raise QuorumError(str(e)) from None

    def _begin(self, quorum: Quorum) -> None:
        self._quorum = quorum
        index = quorum.participants.index(self._id.replica)
        if self._replicas.group is None or quorum.group_id != self._replicas.group_id:
            try:
                self._replicas.form(quorum.group_id, index, len(quorum.participants))
            except Exception as e:
                # The others fail the same way; the step is voted down and the
                # next quorum names a new group.
                self._discard_reason = f"replica group: {_first_line(e)}"
                self._replicas.fail()
                return
        if quorum.heal:
            self._heal(quorum, quorum.participants.index(quorum.source_replica))

    def _heal(self, quorum: Quorum, source: int) -> None:
        """The state goes from the source to the participants behind it
        only, point to point, a tensor (or CHUNK_BYTES of one) at a time;
        those in step with it take no part past learning who is behind."""
        behind = quorum.max_committed_steps
        try:
            steps = self._replicas.allgather(self._step, len(quorum.participants))
        except Exception as e:
            self._heal_failed(e, self._step < behind)
            return
        receivers = [i for i, steps_done in enumerate(steps) if steps_done < behind]
        if not receivers:
            return  # nobody is behind after all
        if self._id.replica == quorum.source_replica:
            self._send_state(receivers)
        elif self._step < behind:
            self._receive_state(quorum, source)

    def _heal_failed(self, e: BaseException, receiving: bool) -> None:
        self._discard_reason = f"heal: {_first_line(e)}"
        self._replicas.fail()
        if receiving:
            # Half received: arrive as the least advanced, so that the
            # next quorum heals this group again.
            self._step, self._history = 0, []

    def _send_state(self, receivers: list[int]) -> None:
        device = self._replicas.device
        try:
            state = self._state_dict()
            skeleton, tensors = _state.split(
                {"step": self._step, "history": self._history, "state": state}
            )
        except Exception as e:
            try:  # the receivers must not wait
                self._replicas.send(_header(-1, device), receivers, 0)
            except Exception:
                pass  # they are gone too: this line is still the one to print
            raise CallbackError("state_dict", e) from None
        try:
            self._replicas.send(_header(len(skeleton), device), receivers, 0)
            data = torch.frombuffer(bytearray(skeleton), dtype=torch.uint8).to(device)
            self._replicas.send(data, receivers, 1)
            tag = 2
            for tensor in tensors:
                for chunk in _chunks(tensor):
                    self._replicas.send(chunk.to(device), receivers, tag)
                    tag += 1
        except Exception as e:
            self._heal_failed(e, False)

    def _receive_state(self, quorum: Quorum, source: int) -> None:
        device = self._replicas.device
        try:
            header = _header(0, device)
            self._replicas.recv(header, source, 0)
            length = int(header.item())
            if length < 0:
                raise RuntimeError(f"replica {quorum.source_replica}'s state_dict callback failed")
            data = torch.empty(length, dtype=torch.uint8, device=device)
            self._replicas.recv(data, source, 1)
            skeleton, metas = _state.load_skeleton(data.cpu().numpy().tobytes())
            del data
            tensors, tag, on_cpu = [], 2, set(skeleton["cpu"])
            for i, meta in enumerate(metas):
                tensor = torch.empty(meta.shape, dtype=meta.dtype, device=device)
                for chunk in _chunks(tensor):
                    self._replicas.recv(chunk, source, tag)
                    tag += 1
                # Over NCCL: a tensor the source kept on the CPU stays there.
                tensors.append(tensor.cpu() if i in on_cpu else tensor)
        except _state.RefusedState as e:
            self._replicas.fail()
            raise HealRefused(quorum.source_replica, str(e)) from None
        except Exception as e:
            self._heal_failed(e, True)
            return
        try:
            received = _state.join(skeleton, tensors, self._state_dict())
            del tensors
            self._load_state_dict(received["state"])
        except Exception as e:
            raise CallbackError("load_state_dict", e) from None
        _log(
            f"replica {self._id.replica} member {self._id.member} healed from replica "
            f"{quorum.source_replica} at step {received['step']} (restart "
            f"{self._id.incarnation}, it had {self._step} steps)"
        )
        self._step, self._history = received["step"], received["history"]

    def _group_agrees(self, commit: bool) -> bool:
        """The members of a replica group apply a step together or not at
        all (one whose answer was lost and then told "discard" by a restarted
        daemon makes all discard): a minimum over the group."""
        if self._id.replica_size == 1:
            return commit
        flag = torch.tensor([1 if commit else 0], dtype=torch.int32, device=self._group_device)
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        except Exception:
            return False
        return bool(flag.item())

    def _record(self) -> None:
        """MESHRUN_FT_RECORD_DIR: each worker writes what a replay checks
        (its committed steps' participants and its final state)."""
        directory = os.environ.get("MESHRUN_FT_RECORD_DIR")
        if not directory:
            return
        path = os.path.join(directory, f"replica{self._id.replica}_member{self._id.member}.pt")
        record = {
            "replica": self._id.replica,
            "member": self._id.member,
            "incarnation": self._id.incarnation,
            "pid": os.getpid(),
            "steps": self._step,
            "history": self._history,
            "state": _state.record_bytes(self._state_dict()),
        }
        torch.save(record, path + ".tmp")
        os.replace(path + ".tmp", path)


class _TrainingOver(Exception):
    """The groups that finished training left before this one came back."""


class QuorumError(SystemExit):
    """The daemon refused the step quorum (the state lost, a stale worker):
    one line, exit 1."""

    def __init__(self, why: str) -> None:
        super().__init__(1)
        self.message = f"meshrun.ft: step quorum: {why}"
        _log(self.message.removeprefix("meshrun.ft: "))

    def __str__(self) -> str:
        return self.message


class HealRefused(SystemExit):
    """A heal's state that would run code to load (anything but tensors and
    plain values): refused with one line, exit 1, never loaded."""

    def __init__(self, source: int, why: str) -> None:
        super().__init__(1)
        self.message = f"meshrun.ft: the heal from replica {source} is refused: {why}"
        _log(self.message.removeprefix("meshrun.ft: "))

    def __str__(self) -> str:
        return self.message


class CallbackError(SystemExit):
    """The program's state_dict or load_state_dict raised: one line, exit 1
    (this group restarts; it never trains on from a state it did not get)."""

    def __init__(self, callback: str, error: BaseException) -> None:
        super().__init__(1)
        self.message = f"meshrun.ft: the {callback} callback raised {_first_line(error)}"
        _log(self.message.removeprefix("meshrun.ft: "))

    def __str__(self) -> str:
        return self.message


CHUNK_BYTES = 64 << 20  # a heal's unit of transfer (and of host copies)


def _header(value: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64, device=device)


def _chunks(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A contiguous tensor's bytes as views of at most CHUNK_BYTES (none
    when it is empty): sent and received in place."""
    if tensor.numel() == 0:
        return
    flat = tensor.reshape(-1).view(torch.uint8)
    for start in range(0, flat.numel(), CHUNK_BYTES):
        yield flat[start : start + CHUNK_BYTES]


def _current() -> Manager:
    if _manager is None:
        raise UsageError("make the meshrun.ft.Manager before iterating the data")
    return _manager


def _flatten_by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, torch.Tensor]:
    """One flat buffer per dtype (a DTensor's local shard for FSDP2's)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(_local(t))
    return {dtype: torch.cat([t.reshape(-1) for t in ts]) for dtype, ts in groups.items()}


def _unflatten(flats: dict[torch.dtype, torch.Tensor], tensors: list[torch.Tensor]) -> None:
    offsets = dict.fromkeys(flats, 0)
    for t in tensors:
        local = _local(t)
        offset = offsets[t.dtype]
        local.copy_(flats[t.dtype][offset : offset + local.numel()].view_as(local))
        offsets[t.dtype] = offset + local.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _exit_training_over(e: _TrainingOver) -> None:
    _log(f"nothing to do: {e}")
    raise SystemExit(0)


class Optimizer:
    """Wraps a torch optimizer: zero_grad joins the step's quorum, step
    averages the gradients over the participants and applies them only when
    the step commits (torchft's Optimizer)."""

    def __init__(self, manager: Manager, optimizer: torch.optim.Optimizer) -> None:
        self.manager = manager
        self.optim = optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        try:
            self.manager.start_step()
        except _TrainingOver as e:
            _exit_training_over(e)
        self.optim.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> bool:
        """True when the step committed and was applied."""
        if closure is not None:
            raise UsageError("Optimizer.step(closure) is not supported")
        params = [p for g in self.optim.param_groups for p in g["params"] if p.requires_grad]
        for p in params:
            # A parameter this group did not use still takes the others'
            # average, and every group's buffer has the same layout.
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not self.manager.reduce_and_vote([p.grad for p in params]):
            return False
        self.optim.step()
        return True

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optim.load_state_dict(state)


def DistributedDataParallel(  # noqa: N802 - torchft's spelling of a wrapper
    manager: Manager, module: nn.Module, **kwargs: Any
) -> nn.Module:
    """torchft's DistributedDataParallel(manager, module): torch's DDP inside
    this replica group (the default group, ft.init_process_group); the
    average across groups is ft.Optimizer's. A group of one needs none."""
    del manager  # the cross-group average is in ft.Optimizer.step
    if dist.get_world_size() == 1:
        return module
    return nn.parallel.DistributedDataParallel(module, **kwargs)


class DistributedSampler(Sampler[int]):
    """torch's DistributedSampler over every worker of every replica group
    at full strength, serving each step's batch by the step's number: the
    data position travels with a heal. A failed group's rows are left out of
    the steps it misses; a discarded step is trained again on its own batch.

    Iterate it through a DataLoader with ``num_workers=0`` and the same
    ``batch_size`` (a batch is drawn when its step begins).
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        num_replicas: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        identity = _my_identity()
        self._replicas = num_replicas or identity.replicas_at_full_strength
        self._shards = self._replicas * identity.replica_size
        self._shard = identity.replica * identity.replica_size + identity.member
        self._dataset_len = len(dataset)  # type: ignore[arg-type]
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._seed = seed
        self._per_shard = -(-self._dataset_len // self._shards)
        self.steps_per_epoch = -(-self._per_shard // batch_size)
        self.epoch = 0

    @property
    def start_epoch(self) -> int:
        """The epoch of the step trained next (a healed group's is late)."""
        return _current().current_step() // self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self._per_shard

    def _indices(self, epoch: int) -> list[int]:
        if self._shuffle:
            g = torch.Generator()
            g.manual_seed(self._seed + epoch)
            indices = torch.randperm(self._dataset_len, generator=g).tolist()
        else:
            indices = list(range(self._dataset_len))
        total = self._per_shard * self._shards
        indices += (indices * (-(-total // len(indices))))[: total - len(indices)]
        return indices[self._shard : total : self._shards]

    def __iter__(self) -> Iterator[int]:
        manager = _current()
        epoch = self.epoch
        while True:
            done = manager.current_step() // self.steps_per_epoch > epoch
            if done and not manager.step_in_progress:
                return  # this epoch's steps are done
            try:
                step = manager.start_step()
            except _TrainingOver as e:
                _exit_training_over(e)
            step_epoch, k = divmod(step, self.steps_per_epoch)
            if step_epoch > epoch:
                return  # healed past this epoch: the step waits for the loop's next
            batch = self._indices(step_epoch)[k * self._batch_size : (k + 1) * self._batch_size]
            yield from batch
            if len(batch) < self._batch_size:
                return  # a short last batch ends the epoch for the DataLoader

"""The replica dimension: this member's counterparts in the step's participants.

Member m of every participating replica group forms one process group, over
which the gradients are averaged and a heal's state is sent. When the
participants change (a group failed, came back or joined), the group is
changed in place where the backend supports torch's reconfigure (Gloo in
torch 2.15: the same process group, new peers), else rebuilt under a fresh
store prefix. Either way keyed by the quorum's group id, which the daemon
never repeats.

NCCL (torchft's rules for it): a peer's failure must fail this process's
collective, never the process. So the group is built with
TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (the watchdog aborts the communicators and
leaves the process alone; the agent's 1, torchrun's, which the default group
keeps, would take the survivors down), with a non-blocking communicator
connected when the group forms (a peer gone at that moment fails the form,
not a later collective), and every wait is the CPU's, bounded by the
timeout: a plain wait() on NCCL only orders the streams and never raises. A
wait past its timeout aborts the communicator (a timer, so that a hang
inside NCCL is cut as well); a group replaced or failed is aborted, so that
no communicator leaks. Each group is a fresh communicator.
"""

import contextlib
import datetime
import os
import threading
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReconfigureOptions

from meshrun._identity import ReplicaIdentity

# ProcessGroupNCCL reads these in its constructor (torch/csrc/distributed/
# c10d/ProcessGroupNCCL.hpp): 2 is CleanUpOnly (abort the communicators on an
# error, keep the process).
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_CLEAN_UP_ONLY = "2"
NCCL_NONBLOCKING_TIMEOUT = "TORCH_NCCL_NONBLOCKING_TIMEOUT"


@contextlib.contextmanager
def _env(changes: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def nccl_group(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, device: torch.device
) -> dist.ProcessGroup:
    """A ProcessGroupNCCL whose errors fail its works, not the process, its
    communicator connected now (raises when a peer does not come)."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    options.config.blocking = False  # init and abort that a timeout can cut
    # The non-blocking communicator's own wait (its init, its abort): the
    # timeout, unless the program set one (torchft does the same).
    os.environ.setdefault(NCCL_NONBLOCKING_TIMEOUT, str(max(1, int(timeout.total_seconds()))))
    with _env({NCCL_ERROR_HANDLING: NCCL_CLEAN_UP_ONLY}):
        group = dist.ProcessGroupNCCL(store, rank, size, options)
    try:
        with _abort_after(group, timeout):
            group.eager_connect_single_device(device)
    except BaseException:
        _abort(group)  # half made: its communicator must not leak either
        raise
    return group


@contextlib.contextmanager
def _abort_after(group: dist.ProcessGroup, timeout: datetime.timedelta) -> Iterator[None]:
    """Aborts `group` when the block outlasts `timeout`: a wait inside NCCL
    (a kernel whose peer is gone) is cut, and the block raises TimeoutError."""
    fired = threading.Event()

    def fire() -> None:
        fired.set()
        _abort(group)

    timer = threading.Timer(timeout.total_seconds(), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        if not fired.is_set():
            raise
    finally:
        timer.cancel()
    if fired.is_set():
        raise TimeoutError(f"no answer from a peer in {timeout.total_seconds():g} s: aborted")


def _abort(group: dist.ProcessGroup) -> None:
    try:
        group.abort()
    except Exception:
        pass  # a backend without abort: its pairs close with it


class ReplicaDimension:
    def __init__(
        self,
        identity: ReplicaIdentity,
        store: dist.Store,
        backend: str,
        timeout: datetime.timedelta,
    ) -> None:
        self._id = identity
        self._store = store
        self._backend = backend
        self._timeout = timeout
        self._pg: dist.ProcessGroup | None = None  # Gloo with enable_reconfigure
        self.group = None  # what collectives go over; None: not formed
        self.group_id = 0
        # Where the heal's and the collectives' tensors live.
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )

    def _keys(self, suffix: str) -> dist.Store:
        return dist.PrefixStore(f"ft/member{self._id.member}/{suffix}", self._store)

    def form(self, group_id: int, index: int, size: int) -> None:
        """Makes the group of the step's participants (this one at `index`).
        Raises on failure (a peer gone): the step is then voted down."""
        self.drop()
        if self._backend == "gloo":
            self._reconfigure(group_id, index, size)
        else:
            self.group = nccl_group(
                self._keys(f"group{group_id}/"), index, size, self._timeout, self.device
            )
        self.group_id = group_id

    def _reconfigure(self, group_id: int, index: int, size: int) -> None:
        if self._pg is None:
            # The rank only makes this process's handle unique: reconfigure
            # assigns the ranks of each configuration from the handles' order.
            self._pg = dist.ProcessGroupGloo(
                self._keys("pg/"),
                self._id.replica,
                max(self._id.replicas_in_world, self._id.replica + 1),
                self._timeout,
                enable_reconfigure=True,
            )
        handles = self._keys(f"group{group_id}/")
        handles.set(f"handle{index}", self._pg.get_reconfigure_handle())
        keys = [f"handle{i}" for i in range(size)]
        handles.wait(keys, self._timeout)
        options = ReconfigureOptions()
        options.uuid = group_id
        options.handles = [handles.get(k).decode() for k in keys]
        options.timeout = self._timeout
        try:
            self._pg.reconfigure(options).wait()
        except Exception:
            self._pg = None  # a failed reconfigure: the next one starts afresh
            raise
        self.group = self._pg

    def drop(self) -> None:
        """Forgets the group (the participants change). A replaced NCCL
        group is aborted: its communicator would otherwise leak (and its
        peers may be gone, which a clean shutdown would wait for)."""
        group, self.group = self.group, None
        self.group_id = 0
        if group is not None and self._backend != "gloo":
            _abort(group)

    def fail(self) -> None:
        """A collective failed: closes this process's connections now, so that
        peers blocked on it fail at once rather than at their timeout, and
        starts afresh at the next group."""
        group, self._pg, self.group = self.group, None, None
        self.group_id = 0
        if group is not None:
            _abort(group)

    def _run(self, issue: Callable[[dist.ProcessGroup], list]) -> None:
        """Issues works on the group and waits for each, or raises: bounded
        by the timeout on every backend. Gloo's ops raise at the group's
        timeout; NCCL's wait with a timeout blocks the CPU and raises, and
        the timer also cuts an issue that hangs (a p2p communicator's
        init with a peer gone)."""
        group = self.group
        if self._backend == "gloo":
            for work in issue(group):
                work.wait()
            return
        with _abort_after(group, self._timeout):
            for work in issue(group):
                work.wait(self._timeout)
        error = group.get_error()
        if error != type(error).SUCCESS:
            raise RuntimeError(f"NCCL: {error.name}")

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self._run(lambda g: [g.broadcast([tensor], options)])

    def allreduce(self, tensor: torch.Tensor) -> None:
        if tensor.device == self.device or self._backend == "gloo":
            self._run(lambda g: [g.allreduce([tensor])])
            return
        # A CPU tensor over NCCL (a model on CPU on a CUDA machine): by the device.
        moved = tensor.to(self.device)
        self._run(lambda g: [g.allreduce([moved])])
        tensor.copy_(moved)

    def allgather(self, value: int, size: int) -> list[int]:
        """Every participant's `value`, by index."""
        mine = torch.tensor([value], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(mine) for _ in range(size)]
        self._run(lambda g: [g.allgather([out], [mine])])
        return [int(t.item()) for t in out]

    def send(self, tensor: torch.Tensor, peers: list[int], tag: int) -> None:
        """`tensor` (contiguous, on self.device) to each of `peers`."""
        self._run(lambda g: [g.send([tensor], peer, tag) for peer in peers])

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        self._run(lambda g: [g.recv([tensor], peer, tag)])

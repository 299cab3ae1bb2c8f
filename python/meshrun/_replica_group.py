"""The replica dimension: this member's counterparts in the step's participants.

Member m of every participating replica group forms one process group, over
which the gradients are averaged and a heal's state is broadcast. When the
participants change (a group failed, came back or joined), the group is
changed in place where the backend supports torch's reconfigure (Gloo in
torch 2.15: the same process group, new peers), else rebuilt under a fresh
store prefix. Either way keyed by the quorum's group id, which the daemon
never repeats.
"""

import datetime

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReconfigureOptions

from meshrun._identity import ReplicaIdentity


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

    def _keys(self, suffix: str) -> dist.Store:
        return dist.PrefixStore(f"ft/member{self._id.member}/{suffix}", self._store)

    def form(self, group_id: int, index: int, size: int) -> None:
        """Makes the group of the step's participants (this one at `index`).
        Raises on failure (a peer gone): the step is then voted down."""
        self.drop()
        if self._backend == "gloo":
            self._reconfigure(group_id, index, size)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            self.group = dist.ProcessGroupNCCL(
                self._keys(f"group{group_id}/"), index, size, options
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
        """Forgets the group (the participants change)."""
        self.group = None
        self.group_id = 0

    def fail(self) -> None:
        """A collective failed: closes this process's connections now, so that
        peers blocked on it fail at once rather than at their timeout, and
        starts afresh at the next group."""
        pg, self._pg = self.group, None
        self.drop()
        if pg is not None:
            try:
                pg.abort()
            except Exception:
                pass  # a backend without abort: its pairs close with it

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self.group.broadcast([tensor], options).wait()

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.group.allreduce([tensor]).wait()

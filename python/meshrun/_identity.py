"""Who this worker is among the replica groups, from meshrun's environment.

Pure: reads a mapping, raises IdentityError with one line when the
environment is not meshrun's under ``--restart-scope=replica``.
"""

from collections.abc import Mapping
from dataclasses import dataclass


class IdentityError(ValueError):
    """One line: why this environment is not meshrun's under
    ``--restart-scope=replica`` (meshrun.ft turns it into a UsageError)."""


@dataclass(frozen=True)
class ReplicaIdentity:
    run_id: str
    replica: int  # the replica group (MESHRUN_REPLICA_ID)
    member: int  # rank within the replica group
    replica_size: int  # members per group (MESHRUN_REPLICA_SIZE)
    replicas_in_world: int  # groups in this world (WORLD_SIZE / replica_size)
    # Groups at full strength (MESHRUN_NUM_REPLICAS: --nnodes MAX's worth),
    # more than replicas_in_world while an elastic job has fewer nodes.
    replicas_at_full_strength: int
    incarnation: int  # restarts of this group (MESHRUN_REPLICA_RESTARTS)
    admission: int  # the node's admission into its slot (0: unknown)
    endpoint: str  # the daemon's gRPC endpoint (MESHRUN_STORE_ENDPOINT)
    master_addr: str  # the workers' TCPStore (torchrun's MASTER_ADDR/PORT)
    master_port: int

    @property
    def store_prefix(self) -> str:
        """The replica group's own keys: a restarted incarnation, or a later
        occupant of the node's slot, never reads its predecessor's."""
        admission = f"admission{self.admission}/" if self.admission else ""
        return f"ft/replica{self.replica}/{admission}incarnation{self.incarnation}/"


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name, "")
    if value == "":
        if default is None:
            raise IdentityError(f"{name} is not set: start this program with meshrun")
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise IdentityError(f"{name}={value!r} is not an integer") from None
    if parsed < 0:
        raise IdentityError(f"{name}={value!r} is negative")
    return parsed


def identity_from_env(env: Mapping[str, str]) -> ReplicaIdentity:
    """The identity meshrun --restart-scope=replica gives each worker."""
    endpoint = env.get("MESHRUN_STORE_ENDPOINT", "")
    if not endpoint:
        raise IdentityError(
            "MESHRUN_STORE_ENDPOINT is not set: restart-free recovery needs meshrun's "
            "daemon; start this program with meshrun --restart-scope=replica --replica-size=N"
        )
    if env.get("MESHRUN_RESTART_SCOPE") != "replica":
        raise IdentityError(
            "meshrun runs this job with --restart-scope=job, where a failure restarts every "
            "worker and training would start over from step 0: start it with meshrun "
            "--restart-scope=replica --replica-size=N"
        )
    size = _int(env, "MESHRUN_REPLICA_SIZE")
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE")
    if size < 1 or world % size != 0:
        raise IdentityError(f"a world of {world} workers does not split into groups of {size}")
    if local_world % size != 0:
        # The launcher refuses this too; a group must die and restart as one.
        raise IdentityError(
            f"replica groups of {size} workers would span nodes "
            f"({local_world} workers on this node): --nproc-per-node must be a multiple "
            "of --replica-size"
        )
    replica = rank // size
    named = _int(env, "MESHRUN_REPLICA_ID", replica)
    if named != replica:
        raise IdentityError(f"MESHRUN_REPLICA_ID={named} but rank {rank} is in group {replica}")
    in_world = world // size
    full_strength = _int(env, "MESHRUN_NUM_REPLICAS", in_world)
    if full_strength < in_world:
        raise IdentityError(
            f"MESHRUN_NUM_REPLICAS={full_strength} is fewer than the {in_world} replica "
            "groups in this world"
        )
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if not run_id:
        raise IdentityError("TORCHELASTIC_RUN_ID is not set: the daemon's quorum is per run")
    return ReplicaIdentity(
        run_id=run_id,
        replica=replica,
        member=rank % size,
        replica_size=size,
        replicas_in_world=in_world,
        replicas_at_full_strength=full_strength,
        incarnation=_int(env, "MESHRUN_REPLICA_RESTARTS", 0),
        admission=_int(env, "MESHRUN_ADMISSION_EPOCH", 0),
        endpoint=endpoint,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT"),
    )

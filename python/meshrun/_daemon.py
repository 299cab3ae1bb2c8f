"""The daemon's step quorum and commit vote over gRPC (proto/meshrun/v1).

The same calls and retry rules as the worker library's FaultTolerantReplicas
(worker_lib/training/fault_tolerant.cc): a daemon restarting, or a quorum no
group completed in time, is retried for three timeouts; a lost commit answer
is asked again (the daemon answers a decided step with its decision).
"""

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from meshrun._errors import UsageError
from meshrun._identity import ReplicaIdentity
from meshrun.v1 import rendezvous_pb2, rendezvous_pb2_grpc

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_CALL_SLACK_S = 10.0  # on top of the daemon's own wait


class DaemonError(RuntimeError):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Quorum:
    quorum_id: int
    participants: list[int]
    max_committed_steps: int
    source_replica: int
    heal: bool
    group_id: int


def _read(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"{name}={path}: {e.strerror}") from None


def _token(env: Mapping[str, str]) -> str:
    """As the C++ client: MESHRUN_RDZV_TOKEN, else the file MESHRUN_RDZV_TOKEN_FILE."""
    token = env.get("MESHRUN_RDZV_TOKEN", "")
    name = "MESHRUN_RDZV_TOKEN_FILE"
    if not token and env.get(name):
        token = _read(env[name], name).decode().strip()
    return token


def _split_host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"MESHRUN_STORE_ENDPOINT entry {entry!r} is not host:port")
    return host, int(port)


def channel_target(endpoint: str) -> tuple[str, str]:
    """The gRPC target for the daemon's endpoint, and the host name a TLS
    channel checks certificates against ("" for one endpoint).

    One "host:port" is the target as it is. A list "h1:p1,h2:p2" names daemon
    replicas, of which one serves at a time: as the C++ clients do
    (rendezvous/client/endpoint_list.h), every entry is resolved now and the
    target names all their addresses in order ("ipv4:a:p,b:p", or "ipv6:" with
    IPv4 addresses mapped), so gRPC's pick_first connects to the first that
    accepts and, after losing it, searches the list again.
    """
    if "," not in endpoint:
        return endpoint, ""
    entries = [entry.strip() for entry in endpoint.split(",")]
    addresses: list[tuple[str, int]] = []
    for entry in entries:
        host, port = _split_host_port(entry)
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            continue  # the others may serve
        for family, _, _, _, sockaddr in found:
            if family in (socket.AF_INET, socket.AF_INET6) and (sockaddr[0], port) not in addresses:
                addresses.append((sockaddr[0], port))
    tls_name = _split_host_port(entries[0])[0]
    if not addresses:
        return entries[0], tls_name
    if all(":" not in ip for ip, _ in addresses):
        return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in addresses), tls_name
    parts = [f"[{ip}]:{port}" if ":" in ip else f"[::ffff:{ip}]:{port}" for ip, port in addresses]
    return "ipv6:" + ",".join(parts), tls_name


def _channel(endpoint: str, env: Mapping[str, str]) -> grpc.Channel:
    """TLS when MESHRUN_RDZV_TLS_CA names the daemon's CA (with a client
    certificate when MESHRUN_RDZV_TLS_CERT and _KEY name one). `endpoint` may
    be a list of daemon replicas (channel_target)."""
    options: list[tuple[str, object]] = [("grpc.enable_http_proxy", 0)]
    if "," in endpoint:
        # As the agent's channel to a list: a leader gone silent (its host
        # cut off) is noticed by pings within seconds, and a connection
        # attempt to it gives up after 3 s (gRPC's default is 20) so the next
        # replica is tried.
        options += [
            ("grpc.keepalive_time_ms", 2000),
            ("grpc.keepalive_timeout_ms", 2000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.min_reconnect_backoff_ms", 3000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
    endpoint, tls_name = channel_target(endpoint)
    ca = env.get("MESHRUN_RDZV_TLS_CA", "")
    if not ca:
        return grpc.insecure_channel(endpoint, options=options)
    if tls_name:
        options.append(("grpc.ssl_target_name_override", tls_name))
    cert, key = env.get("MESHRUN_RDZV_TLS_CERT", ""), env.get("MESHRUN_RDZV_TLS_KEY", "")
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "MESHRUN_RDZV_TLS_CA"),
        private_key=_read(key, "MESHRUN_RDZV_TLS_KEY") if key else None,
        certificate_chain=_read(cert, "MESHRUN_RDZV_TLS_CERT") if cert else None,
    )
    return grpc.secure_channel(endpoint, creds, options=options)


class DaemonClient:
    def __init__(self, identity: ReplicaIdentity, env: Mapping[str, str] = os.environ) -> None:
        self._id = identity
        self._channel = _channel(identity.endpoint, env)
        self._stub = rendezvous_pb2_grpc.RendezvousStub(self._channel)
        token = _token(env)
        # The daemon's token rule (rendezvous/security): a bearer token per call.
        self._metadata = [("authorization", f"Bearer {token}")] if token else []

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, wait_s: float, retry_for_s: float):
        give_up = time.monotonic() + retry_for_s
        while True:
            try:
                return method(request, timeout=wait_s + _CALL_SLACK_S, metadata=self._metadata)
            except grpc.RpcError as e:
                code = e.code()
                if code not in _RETRYABLE or time.monotonic() >= give_up:
                    raise DaemonError(code, e.details() or code.name) from None
            time.sleep(0.2)

    def quorum(self, committed_steps: int, timeout_s: float, finished: bool) -> Quorum:
        i = self._id
        request = rendezvous_pb2.QuorumRequest(
            run_id=i.run_id,
            replica=i.replica,
            member=i.member,
            replica_size=i.replica_size,
            num_replicas=i.replicas_in_world,
            committed_steps=committed_steps,
            incarnation=i.incarnation,
            timeout_ms=int(timeout_s * 1000),
            finished=finished,
            admission_epoch=i.admission,
        )
        reply = self._call(self._stub.Quorum, request, timeout_s, 3 * timeout_s)
        return Quorum(
            quorum_id=reply.quorum_id,
            participants=list(reply.participants),
            max_committed_steps=reply.max_committed_steps,
            source_replica=reply.source_replica,
            heal=reply.heal,
            group_id=reply.group_id,
        )

    def commit(self, quorum_id: int, ok: bool, timeout_s: float) -> tuple[bool, str]:
        """(commit, why not)."""
        i = self._id
        request = rendezvous_pb2.CommitRequest(
            run_id=i.run_id,
            quorum_id=quorum_id,
            replica=i.replica,
            member=i.member,
            ok=ok,
            timeout_ms=int(timeout_s * 1000),
            admission_epoch=i.admission,
        )
        try:
            reply = self._call(self._stub.Commit, request, timeout_s, 3 * timeout_s)
        except DaemonError as e:
            return False, f"commit vote: {e}"
        return reply.commit, reply.reason

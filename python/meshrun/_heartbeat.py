"""meshrun.heartbeat(): tell this node's agent the worker is making progress.

Under ``meshrun --hang-timeout`` (on by default) the agent judges a worker by
its CPU time and output; once the worker has sent a heartbeat, by its
heartbeats alone, so a rank that spins in a collective that never completes
is caught too. Call it once a training step, or more often than the timeout.

``step_seconds``, when given, is the time this rank's step took by its own
measure, before the collective that makes every rank wait for the slowest
(e.g. its forward and backward): the daemon compares the ranks' means and
shows the slow ones on its status page (stragglers).

A heartbeat is a datagram to the agent's abstract Unix socket named in
``MESHRUN_HEARTBEAT_SOCKET``; the kernel tells the agent which process sent
it, so only the worker process itself counts (not its data loader
processes). Outside meshrun, or with ``--hang-timeout 0``, it does nothing.
"""

from __future__ import annotations

import os
import socket
import threading

_ENV = "MESHRUN_HEARTBEAT_SOCKET"
_lock = threading.Lock()
_socket: socket.socket | None = None
_address: str | None = None
_pid = 0


def heartbeat(step_seconds: float | None = None) -> bool:
    """Send one heartbeat; False where there is no agent to send it to.

    Never raises and never blocks: a heartbeat the agent's queue has no room
    for is dropped (the next one will do).
    """
    global _socket, _address, _pid
    name = os.environ.get(_ENV, "")
    if not name.startswith("@"):
        return False
    with _lock:
        # A forked child (a data loader) must not reuse its parent's socket.
        if _socket is None or _pid != os.getpid() or _address != name:
            if _socket is not None:
                _socket.close()
            _socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
            _address = name
            _pid = os.getpid()
        try:
            payload = b"1" if step_seconds is None else b"step=%.6f" % step_seconds
            _socket.sendto(payload, "\0" + name[1:])
        except OSError:
            return False
    return True

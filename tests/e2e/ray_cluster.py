"""A Ray cluster of several nodes on this machine's loopback, for tests and
benchmarks that run under `unshare --net --pid --fork --mount-proc`: a head
holding no CPUs (as a head kept for Ray's own services) and nodes of 2 CPUs,
each started with `ray start --address` as its own Ray node."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runs(pid: str, name: str) -> bool:
    """Whether process ``pid``'s command line holds ``name``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return name.encode() in f.read()
    except OSError:
        return False


class Cluster:
    """A head with no CPUs and ``nodes`` nodes of 2 CPUs, on 127.0.0.1."""

    def __init__(self, ray: str, temp: str, nodes: int) -> None:
        self.ray = ray
        self.address = f"127.0.0.1:{free_port()}"
        self._common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        port = self.address.split(":")[1]
        head = ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"]
        self._start([*head, f"--temp-dir={temp}", *self._common])
        for _ in range(nodes):
            self.add_node()

    def add_node(self, hide: tuple[str, ...] = ()) -> None:
        """A node of 2 CPUs. ``hide``: folders this node does not see (its
        raylet and all it starts live in a mount namespace with an empty
        tmpfs over each), as on a machine that lacks them."""
        self._start([f"--address={self.address}", "--num-cpus=2", *self._common], hide)

    def kill_raylet(self, node_id_prefix: str) -> int:
        """SIGKILLs the raylet of the Ray node whose id starts so: the node
        dies, as far as Ray can tell, but what it started runs on."""
        pid = self.raylet_pid(node_id_prefix)
        os.kill(pid, signal.SIGKILL)
        return pid

    def raylet_pid(self, node_id_prefix: str) -> int:
        for pid in os.listdir("/proc"):
            if (
                pid.isdigit()
                and runs(pid, "raylet/raylet")
                and runs(pid, f"--node_id={node_id_prefix}")
            ):
                return int(pid)
        raise AssertionError(f"no raylet of Ray node {node_id_prefix}")

    def kill_node(self, node_id_prefix: str) -> list[int]:
        """SIGKILLs the raylet of the Ray node whose id starts so and every
        process it started (Ray's workers, the node's agents): the node dies
        as with its machine. A raylet killed alone leaves its workers running
        as orphans, which a dead machine would not."""
        raylet = self.raylet_pid(node_id_prefix)
        parents = {}
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        tree, grew = {raylet}, True
        while grew:
            found = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= found
            grew = bool(found)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return sorted(tree)

    def _start(self, flags: list[str], hide: tuple[str, ...] = ()) -> None:
        argv = [self.ray, "start", *flags]
        if hide:
            mounts = "".join(f"mount -t tmpfs none {shlex.quote(d)} && " for d in hide)
            script = mounts + "exec " + shlex.join(argv)
            argv = ["unshare", "--mount", "--propagation=private", "sh", "-c", script]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"ray start {flags}: {done.stdout}{done.stderr}")

    def stop(self) -> None:
        subprocess.run([self.ray, "stop", "--force"], capture_output=True, timeout=120)

    def wait_alive(self, count: int, timeout_s: float = 180) -> None:
        """Until Ray counts exactly ``count`` alive nodes with CPUs: a node
        started has joined, and one whose raylet was killed is marked dead."""
        code = (
            "import ray, sys, time\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"deadline = time.monotonic() + {timeout_s}\n"
            "while time.monotonic() < deadline:\n"
            "    nodes = ray.nodes()\n"
            "    if sum(n['Alive'] and n['Resources'].get('CPU', 0) > 0 for n in nodes) == "
            f"{count}:\n"
            "        sys.exit(0)\n"
            "    time.sleep(0.5)\n"
            "sys.exit(1)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s + 60
        )
        assert done.returncode == 0, f"Ray never counted {count} nodes: {done.stderr[-3000:]}"

    def leftovers(self) -> list[str]:
        """Placement groups not removed and actors alive, as Ray's GCS says."""
        code = (
            "import ray, json\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            "pgs = [p['placement_group_id'] for p in ray.util.placement_group_table().values()\n"
            "       if p['state'] != 'REMOVED']\n"
            "from ray._private.state import actors\n"
            "alive = [a['ActorID'] for a in actors().values() if a['State'] != 'DEAD']\n"
            "print(json.dumps(['pg ' + p for p in pgs] + ['actor ' + a for a in alive]))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

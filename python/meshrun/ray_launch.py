"""meshrun --ray: a meshrun job on a Ray cluster from one command.

``meshrun --ray[=ADDRESS] --nnodes=MIN:MAX --nproc-per-node=N SCRIPT ...`` hands
the launch to this driver (``python -m meshrun.ray_launch``), which:

- connects to the cluster (ADDRESS, else $RAY_ADDRESS, else ``auto``) and
  counts the alive nodes that can hold N GPUs (a cluster with GPUs) or N CPUs;
  fewer than MIN is refused in one line;
- reserves one bundle per node (a STRICT_SPREAD placement group of up to MAX
  bundles), so that no other Ray work takes the nodes' devices;
- starts meshrun-rdzvd beside itself, on the address Ray knows this machine
  by (every Ray node reaches it already; the run lives as long as this
  command does);
- places one actor per bundle, which runs ``meshrun`` with the command's
  own flags and this daemon's endpoint on its node, and streams every line
  back here, prefixed ``[nodeK]``.

Its exit code is the run's. SIGINT or SIGTERM stops every agent (their
workers with them), then the actors, the placement group and the daemon.

Ray nodes run the agents with their own environment plus the driver's
PYTHON_EXEC, PYTHONPATH, OMP_NUM_THREADS and MESHRUN_*, PET_*, TORCH*,
NCCL_*, GLOO_* variables, in the driver's working directory.
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

# Exit codes: the run's, else these.
EXIT_USAGE = 2  # bad input: no cluster, too few nodes, no meshrun on a node
EXIT_FAILED = 1

# A newcomer's actor that has not started in this long (the node's
# resources are taken by other work) is given up, and tried again later.
NEWCOMER_START_S = 120
NEWCOMER_RETRY_S = 30

FORWARDED = ("PYTHON_EXEC", "PYTHONPATH", "OMP_NUM_THREADS")
FORWARDED_PREFIXES = ("MESHRUN_", "PET_", "TORCH", "NCCL_", "GLOO_")


class LaunchError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def say(line: str) -> None:
    sys.stderr.write(f"meshrun: --ray: {line}\n")
    sys.stderr.flush()


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="meshrun --ray", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--meshrun", required=True, help="the meshrun binary")
    parser.add_argument("--nnodes", required=True, help="MIN:MAX")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--name-run", action="store_true", help="give the run a fresh id")
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    low, _, high = args.nnodes.partition(":")
    args.min_nodes, args.max_nodes = int(low), int(high or low)
    return args, argv[split + 1 :]


def check_reachable(address: str) -> None:
    """An explicit HOST:PORT with nothing listening is refused at once (Ray
    would retry its connection for a minute)."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"'{address}' is not a Ray address (HOST:PORT, ray://..., or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise LaunchError(f"no Ray cluster at {address}: {e.strerror or e}") from None


def bundle_for(cluster: dict[str, float], nproc: int) -> dict[str, float]:
    return {"GPU": nproc} if cluster.get("GPU", 0) > 0 else {"CPU": nproc}


def forwarded_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in FORWARDED or k.startswith(FORWARDED_PREFIXES)}


def agent_argv(args: argparse.Namespace, launcher_args: list[str], endpoint: str, run_id: str):
    """The node's meshrun command: the command's own flags, the daemon's
    endpoint and the run's id first (flags may come in any order)."""
    ours = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    if args.name_run:
        ours.append(f"--rdzv-id={run_id}")
    return [args.meshrun, *ours, *launcher_args]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null (native code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class NodeAgent:
    """A Ray actor on one node: runs that node's meshrun and keeps its output
    for the driver's polls. Its meshrun dies with it (PR_SET_PDEATHSIG), and
    with the node's raylet: Ray counts a node whose raylet died as dead but
    leaves its worker processes running, and an agent Ray no longer counts
    must not keep its node in the run."""

    def __init__(self) -> None:
        self._raylet = os.getppid()  # Ray's workers are its raylet's children
        self._proc: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._eof = threading.Event()

    def describe(self, meshrun: str, cwd: str) -> dict[str, Any]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "meshrun": os.access(meshrun, os.X_OK) or shutil.which(meshrun) is not None,
            "cwd": os.path.isdir(cwd),
        }

    def start(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        def die_with_actor() -> None:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        import ray

        label = "ray-" + ray.get_runtime_context().get_node_id()[:8]
        self._proc = subprocess.Popen(
            argv,
            env={**os.environ, **env, "MESHRUN_NODE_LABEL": label},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_actor,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._watch_raylet, daemon=True).start()
        return self._proc.pid

    def _watch_raylet(self) -> None:
        while os.getppid() == self._raylet:
            time.sleep(0.5)
        self.signal(signal.SIGKILL)  # the node is lost: so is its agent
        os._exit(1)

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            with self._lock:
                self._lines.append(raw.decode(errors="replace").rstrip("\n"))
        self._eof.set()

    def poll(self) -> tuple[list[str], int | None]:
        """New lines, and the exit code once meshrun ended and said all."""
        assert self._proc is not None
        code = self._proc.poll()
        done = code is not None and self._eof.is_set()  # and every line read
        with self._lock:
            lines, self._lines = self._lines, []
        return lines, code if done else None

    def signal(self, signum: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signum)
            except ProcessLookupError:
                pass


class Run:
    """One --ray launch: what it started, so that it can stop all of it."""

    def __init__(self, args: argparse.Namespace, launcher_args: list[str]) -> None:
        self.args = args
        self.launcher_args = launcher_args
        self.daemon: subprocess.Popen | None = None
        self.placement_group = None
        self.actors: list[Any] = []  # node K's actor at index K
        self.nodes: list[dict[str, Any]] = []  # what each actor said of its node
        self.codes: dict[int, int] = {}  # node K's meshrun exit code
        self.lost: set[int] = set()  # nodes whose actor died with them
        self.bundle: dict[str, float] = {}
        self.agent: tuple[list[str], dict[str, str], str] = ([], {}, "")  # argv, env, cwd
        self.tried: dict[str, float] = {}  # node id -> when a newcomer's actor gave up
        self.pending: dict[str, tuple[Any, Any, float]] = {}  # node id -> a newcomer starting
        self.stopping: int = 0  # the signal that asks us to stop

    def connect(self):
        check_reachable(self.args.address)
        try:
            import ray
        except ImportError:
            raise LaunchError(
                f"ray is not installed for {sys.executable} (pip install ray)"
            ) from None
        # Ray's core writes its own lines to stderr while it connects (e.g.
        # how it found this machine's IP); the driver's lines are ours.
        with quiet_stderr():
            try:
                ray.init(
                    address=self.args.address,
                    log_to_driver=False,
                    logging_level="ERROR",
                    configure_logging=True,
                )
            except (ConnectionError, RuntimeError, ValueError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise LaunchError(
                    f"cannot connect to the Ray cluster at {self.args.address}: {first}"
                ) from None
        return ray

    def reserve(self, ray) -> int:
        from ray.util.placement_group import placement_group

        bundle = self.bundle = bundle_for(ray.cluster_resources(), self.args.nproc_per_node)
        ((kind, need),) = bundle.items()
        fit = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(kind, 0) >= need]
        if len(fit) < self.args.min_nodes:
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            raise LaunchError(
                f"the cluster at {self.args.address} has {len(fit)} nodes with {need:g} "
                f"{kind}s (of {alive} alive), fewer than --nnodes' {self.args.min_nodes}"
            )
        count = min(len(fit), self.args.max_nodes)
        self.placement_group = placement_group([bundle] * count, strategy="STRICT_SPREAD")
        try:
            ray.get(self.placement_group.ready(), timeout=60)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(
                f"Ray could not reserve {count} nodes with {need:g} {kind}s each in 60 s "
                "(other work holds them?)"
            ) from None
        return count

    def start_daemon(self, ray) -> str:
        rdzvd = os.path.join(os.path.dirname(self.args.meshrun), "meshrun-rdzvd")
        host = ray.util.get_node_ip_address()
        self.daemon = subprocess.Popen(
            [rdzvd, f"--host={host}", "--port=0", "--metrics-port=0", "--log-level=warn"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        values = {}
        for _ in range(2):
            line = self.daemon.stdout.readline().strip()
            name, _, value = line.partition("=")
            values[name] = value
        endpoint = values.get("MESHRUN_RDZVD_ENDPOINT")
        if not endpoint:
            raise LaunchError(f"{rdzvd} did not start", EXIT_FAILED)
        say(
            f"rendezvous daemon on {endpoint}, status page http://{values.get('MESHRUN_RDZVD_METRICS')}/"
        )
        return endpoint

    def place_agents(self, ray, count: int, endpoint: str) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
        self.actors = [
            remote.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i
                )
            ).remote()
            for i in range(count)
        ]
        cwd = os.getcwd()
        nodes = ray.get([a.describe.remote(self.args.meshrun, cwd) for a in self.actors])
        lacking = [f"node{i} ({n['hostname']}, Ray node {n['node_id'][:8]})"
                   for i, n in enumerate(nodes) if not n["meshrun"] or not n["cwd"]]  # fmt: skip
        if lacking:
            raise LaunchError(
                f"{self.args.meshrun} or the directory {cwd} is not on {', '.join(lacking)}: "
                "install meshrun there, or share the directory"
            )
        run_id = uuid.uuid4().hex[:12]
        argv = agent_argv(self.args, self.launcher_args, endpoint, run_id)
        self.agent = (argv, forwarded_env(dict(os.environ)), cwd)
        self.nodes = nodes
        for i, n in enumerate(nodes):
            say(f"node{i} is Ray node {n['node_id'][:8]} at {n['ip']} ({n['hostname']})")
        ray.get([a.start.remote(*self.agent) for a in self.actors])

    def place_newcomers(self, ray) -> None:
        """An agent on each alive node that can hold a bundle and has none,
        up to --nnodes MAX: it joins the run as any meshrun node does. Its
        actor holds the bundle's resources itself, pinned to that node (a
        placement group cannot grow). Never waits: an actor still starting
        is looked at again on the next call."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for node_id, (actor, described, since) in list(self.pending.items()):
            ready, _ = ray.wait([described], timeout=0)
            if not ready:
                if time.monotonic() - since > NEWCOMER_START_S:
                    del self.pending[node_id]  # its resources are taken: try again later
                    ray.kill(actor)
                    self.tried[node_id] = time.monotonic()
                continue
            del self.pending[node_id]
            try:
                info = ray.get(described)
            except ray.exceptions.RayError:
                self.tried[node_id] = time.monotonic()  # the node died meanwhile
                continue
            if not info["meshrun"] or not info["cwd"]:
                ray.kill(actor)
                self.tried[node_id] = time.monotonic()
                say(f"Ray node {node_id[:8]} joined without {self.args.meshrun} or "
                    f"{self.agent[2]}: no agent there")  # fmt: skip
                continue
            index = len(self.actors)
            self.actors.append(actor)
            self.nodes.append(info)
            actor.start.remote(*self.agent)
            say(f"node{index} is Ray node {node_id[:8]} at {info['ip']} ({info['hostname']}), "
                "new in the cluster: it joins the run")  # fmt: skip

        live = [i for i in range(len(self.actors)) if i not in self.codes and i not in self.lost]
        used = {self.nodes[i]["node_id"] for i in live} | set(self.pending)
        ((kind, need),) = self.bundle.items()
        room = self.args.max_nodes - len(live) - len(self.pending)
        for node in ray.nodes():
            node_id = node["NodeID"]
            recently = time.monotonic() - self.tried.get(node_id, -1e9) < NEWCOMER_RETRY_S
            if (room <= 0 or not node["Alive"] or node_id in used or recently
                    or node["Resources"].get(kind, 0) < need):  # fmt: skip
                continue
            resources = {"num_gpus": need} if kind == "GPU" else {"num_cpus": need}
            actor = (
                ray.remote(max_restarts=0)(NodeAgent)
                .options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    **resources,
                )
                .remote()
            )
            described = actor.describe.remote(self.args.meshrun, self.agent[2])
            self.pending[node_id] = (actor, described, time.monotonic())
            room -= 1

    def stream(self, ray) -> int:
        """Prints every agent's lines until all have ended; the run's code."""
        codes, lost = self.codes, self.lost
        asked_to_stop = 0.0
        next_look = time.monotonic() + 2
        while len(codes) + len(lost) < len(self.actors):
            if self.stopping and not asked_to_stop:
                asked_to_stop = time.monotonic()
                for i, actor in enumerate(self.actors):
                    if i not in codes and i not in lost:
                        actor.signal.remote(signal.SIGTERM)
            if asked_to_stop and time.monotonic() - asked_to_stop > 40:
                break  # the agents' own shutdown timeout (30 s) has passed
            for i, actor in enumerate(self.actors):
                if i in codes or i in lost:
                    continue
                try:
                    lines, code = ray.get(actor.poll.remote(), timeout=30)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    lost.add(i)
                    ray_node = self.nodes[i]["node_id"][:8]
                    say(f"node{i} (Ray node {ray_node}) is lost ({type(e).__name__}): "
                        "the run goes on as meshrun's elastic rules say")  # fmt: skip
                    continue
                for line in lines:
                    sys.stdout.write(f"[node{i}] {line}\n")
                if code is not None:
                    codes[i] = code
            sys.stdout.flush()
            if not self.stopping and not codes and time.monotonic() > next_look:
                self.place_newcomers(ray)
                next_look = time.monotonic() + 2
            time.sleep(0.1)
        if self.stopping:
            return 128 + self.stopping
        failed = [c for c in codes.values() if c != 0]
        if not codes:
            return EXIT_FAILED
        return failed[0] if failed else 0

    def stop(self, ray) -> None:
        for actor in [*self.actors, *(pending[0] for pending in self.pending.values())]:
            try:
                ray.kill(actor)
            except Exception:
                pass  # gone with its node
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.placement_group)
            except Exception:
                pass
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()


def main(argv: list[str] | None = None) -> int:
    args, launcher_args = parse_args(sys.argv[1:] if argv is None else argv)
    run = Run(args, launcher_args)

    def stop(signum: int, _frame: object) -> None:
        run.stopping = signum

    ray = None
    try:
        ray = run.connect()
        # After ray.init, which installs its own SIGTERM handler.
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        count = run.reserve(ray)
        endpoint = run.start_daemon(ray)
        run.place_agents(ray, count, endpoint)
        return run.stream(ray)
    except LaunchError as e:
        say(str(e))
        return e.code
    finally:
        if ray is not None:
            run.stop(ray)
            ray.shutdown()
        elif run.daemon is not None:
            run.daemon.kill()


if __name__ == "__main__":
    sys.exit(main())

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
NCCL_*, GLOO_* variables, in the driver's working directory. A node that
lacks the program (the script, or with -m the working directory) gets its
folder through Ray's runtime environment (``working_dir``): the agent there
runs in that copy. meshrun itself must be installed on every node.
"""

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Exit codes: the run's, else these.
EXIT_USAGE = 2  # bad input: no cluster, too few nodes, no meshrun on a node
EXIT_FAILED = 1

# A newcomer's actor that has not started in this long (the node's
# resources are taken by other work) is given up, and tried again later.
NEWCOMER_START_S = 120
NEWCOMER_RETRY_S = 30

# An agent's actor that does not answer a poll in this long is taken for
# lost (MESHRUN_RAY_POLL_TIMEOUT_S: tests make it short).
POLL_TIMEOUT_S = 30.0
# How long a node's reaper waits for a SIGKILLed agent to be gone before it
# says it is not (the driver then sends another, the bundle still reserved).
REAP_WAIT_S = 10.0

# Marks every process of one agent (meshrun, and its workers, which inherit
# it) so that its node can find them without the actor: a unique id a
# process cannot be confused by, as a recycled pid could.
AGENT_ID_ENV = "MESHRUN_RAY_AGENT_ID"
# The token the driver's daemon requires, for the daemon and every agent
# (rendezvous/security.h's MESHRUN_RDZV_TOKEN; docs/security.md).
TOKEN_ENV = "MESHRUN_RDZV_TOKEN"
TOKEN_FILE_ENV = "MESHRUN_RDZV_TOKEN_FILE"

# Runs between the actor's fork and the node's meshrun, as a process of its
# own: it asks the kernel for SIGKILL when the actor (its parent) dies, then
# execs meshrun. Not a preexec_fn: code between fork and exec in the actor,
# a threaded process, must not take locks another thread may hold (ctypes
# loading libc takes the dynamic loader's), and this one is single-threaded.
# argv: the actor's pid, then meshrun's argv.
PDEATHSIG_EXEC = """\
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit("meshrun: --ray: prctl(PR_SET_PDEATHSIG): " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    os._exit(1)  # the actor died before the kernel was asked: so does its agent
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.exit(f"meshrun: --ray: cannot run {sys.argv[2]}: {e.strerror}")
"""

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
    parser.add_argument("--program-kind", choices=["script", "module", "binary"], default="script")
    parser.add_argument("--program-args", type=int, default=0, help="the tokens after the program")
    parser.add_argument("--token-file", default="", help="the launch's --token-file, absolute")
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    low, _, high = args.nnodes.partition(":")
    args.min_nodes, args.max_nodes = int(low), int(high or low)
    launcher_args = argv[split + 1 :]
    if not 0 <= args.program_args < len(launcher_args):
        parser.error("--program-args must count the tokens after the program")
    return args, launcher_args


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


def poll_timeout_s(env: dict[str, str]) -> float:
    text = env.get("MESHRUN_RAY_POLL_TIMEOUT_S", "")
    try:
        value = float(text) if text else POLL_TIMEOUT_S
    except ValueError:
        raise LaunchError(
            f"MESHRUN_RAY_POLL_TIMEOUT_S={text!r} is not a number of seconds"
        ) from None
    if not value > 0:
        raise LaunchError(f"MESHRUN_RAY_POLL_TIMEOUT_S={text!r} must be above 0")
    return value


def spawn_dying_with_parent(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen:
    """``argv`` in a session of its own, its stdout and stderr one pipe, and
    SIGKILLed by the kernel when this process dies (PR_SET_PDEATHSIG, through
    PDEATHSIG_EXEC: nothing runs in the child between fork and exec)."""
    return subprocess.Popen(
        [sys.executable, "-c", PDEATHSIG_EXEC, str(os.getpid()), *argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


# A process's /proc/PID/environ reads empty from the moment exec installs its
# new memory until the kernel has copied the environment in: a window in which
# the exec's caller has already returned (subprocess.Popen included). Such a
# process is looked at again for this long before its empty environment is
# taken for real (env -i).
EXEC_WINDOW_S = 1.0
PF_KTHREAD = 0x00200000  # kernel threads have no environment either


def _scan_processes(mark: bytes) -> tuple[list[int], list[int]]:
    """This machine's live processes (not zombies) that carry ``mark``, and
    the user processes whose environment read empty."""
    found: list[int] = []
    empty: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            if not environ:
                if not int(fields[6]) & PF_KTHREAD:
                    empty.append(int(entry))
                continue
            if mark in environ.split(b"\0"):
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found, empty


def agent_processes(agent_id: str) -> list[int]:
    """This machine's live processes (not zombies) that carry ``agent_id``,
    including one caught in the middle of its exec (EXEC_WINDOW_S)."""
    mark = f"{AGENT_ID_ENV}={agent_id}".encode()
    found, empty = _scan_processes(mark)
    settle = time.monotonic() + EXEC_WINDOW_S
    while empty and time.monotonic() < settle:
        time.sleep(0.01)
        found, still_empty = _scan_processes(mark)
        empty = [pid for pid in still_empty if pid in empty]
    return found


def end_agent(agent_id: str, wait_s: float) -> bool:
    """On the agent's node: SIGKILLs every process of that agent until none
    is left; whether none is (False: some outlived ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = agent_processes(agent_id)
        if not found:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def agent_argv(args: argparse.Namespace, launcher_args: list[str], endpoint: str, run_id: str):
    """The node's meshrun command: the command's own flags, the daemon's
    endpoint and the run's id first (flags may come in any order)."""
    ours = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    if args.name_run:
        ours.append(f"--rdzv-id={run_id}")
    return [args.meshrun, *ours, *launcher_args]


class Program:
    """What the agents run, and the folder a node lacking it is sent.

    ``index`` is the program's place in the launcher's arguments; ``path``
    where it is on the driver's machine (None: a module, or a program found
    on the PATH); ``folder`` what Ray's working_dir ships (the script's
    folder, or the working directory for a module; empty: nothing, for a
    program on the PATH); ``shipped_token`` the program's name in that copy."""

    def __init__(self, kind: str, launcher_args: list[str], tail: int, cwd: str) -> None:
        self.index = len(launcher_args) - tail - 1
        token = launcher_args[self.index]
        self.path: str | None = None
        if kind == "module":
            self.folder, self.shipped_token = cwd, token
        elif kind == "binary" and "/" not in token:
            self.folder, self.shipped_token = "", token
        else:
            self.path = os.path.realpath(os.path.join(cwd, token))
            self.folder, self.shipped_token = os.path.dirname(self.path), os.path.basename(token)

    def shipped_args(self, launcher_args: list[str]) -> list[str]:
        return [*launcher_args[: self.index], self.shipped_token, *launcher_args[self.index + 1 :]]


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

    def describe(self, meshrun: str, cwd: str, program: str | None) -> dict[str, Any]:
        """This node: its ids, and whether it has meshrun and the program
        where the driver has them (``own_cwd``: the folder Ray shipped here)."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "meshrun": os.access(meshrun, os.X_OK) or shutil.which(meshrun) is not None,
            "program": os.path.isdir(cwd) and (program is None or os.path.exists(program)),
            "own_cwd": os.getcwd(),
        }

    def start(self, argv: list[str], env: dict[str, str], cwd: str, agent_id: str) -> int:
        import ray

        label = "ray-" + ray.get_runtime_context().get_node_id()[:8]
        env = {**os.environ, **env, "MESHRUN_NODE_LABEL": label, AGENT_ID_ENV: agent_id}
        self._proc = spawn_dying_with_parent(argv, env, cwd)
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


@dataclass
class Newcomer:
    """An agent placed for a node the run gains, until it has started."""

    actor: Any
    described: Any  # its describe() call
    since: float
    bundle: int | None  # the lost node's bundle it was placed in
    node_id: str | None = None  # else: the node it is pinned to


class Run:
    """One --ray launch: what it started, so that it can stop all of it."""

    def __init__(self, args: argparse.Namespace, launcher_args: list[str], out) -> None:
        self.args = args
        self.out = out  # where the nodes' lines go
        self.launcher_args = launcher_args
        self.daemon: subprocess.Popen | None = None
        self.placement_group = None
        self.actors: list[Any] = []  # node K's actor at index K
        self.nodes: list[dict[str, Any]] = []  # what each actor said of its node
        self.codes: dict[int, int] = {}  # node K's meshrun exit code
        self.lost: set[int] = set()  # nodes whose actor died with them, or stopped answering
        self.agent_ids: list[str] = []  # node K's AGENT_ID_ENV
        # A lost node's reaper (end_agent on its node) until it has confirmed
        # that the node's agent is gone: till then its bundle stays reserved.
        self.reaping: dict[int, Any] = {}
        self.reaper: Any = None  # end_agent as a Ray task
        self.reap_again: dict[int, float] = {}  # node K -> when to send another reaper
        self.poll_timeout_s = poll_timeout_s(dict(os.environ))
        self.token = ""  # the token the driver made for its daemon, if it made one
        self.bundle: dict[str, float] = {}
        self.cwd = os.getcwd()
        self.program = Program(args.program_kind, launcher_args, args.program_args, self.cwd)
        self.argv: list[str] = []  # each agent's command
        self.shipped_argv: list[str] = []  # on a node the program was shipped to
        self.env: dict[str, str] = {}
        self.agent_class: Any = None  # NodeAgent as a Ray actor
        self.tried: dict[str, float] = {}  # node id -> when a newcomer's actor gave up
        self.pending: list[Newcomer] = []  # agents placed, not started yet
        self.bundle_of: list[int | None] = []  # node K's bundle (None: pinned to its node)
        self.free_bundles: list[int] = []  # a lost node's, for a newcomer
        self.shipped = False  # the program's folder is the job's working_dir
        self.stopping: int = 0  # the signal that asks us to stop

    def connect(self, ship: bool = False):
        """ray.init; with ``ship``, the program's folder is the job's
        working_dir (Ray ships only a job's local folders), and every actor
        starts in its copy."""
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
                    runtime_env={"working_dir": self.program.folder} if ship else None,
                )
            except (ConnectionError, RuntimeError, ValueError, OSError) as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                # The first line, or the last where the first only introduces
                # a traceback ("Initialization failure from server:").
                first = (lines[-1] if lines[0].endswith(":") else lines[0]) if lines else ""
                first = first or type(e).__name__
                what = f"ship {self.program.folder}" if ship else "connect"
                raise LaunchError(
                    f"cannot {what} to the Ray cluster at {self.args.address}: {first}"
                ) from None
        self.shipped = ship
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
        with quiet_stderr():  # Ray's core says how it found the address
            host = ray.util.get_node_ip_address()
        argv = [rdzvd, f"--host={host}", "--port=0", "--metrics-port=0", "--log-level=warn"]
        env = dict(os.environ)
        if self.args.token_file:
            argv.append(f"--token-file={self.args.token_file}")
        elif not env.get(TOKEN_ENV) and not env.get(TOKEN_FILE_ENV):
            # The daemon listens where every Ray node reaches it, and its store
            # is the workers': without a token anyone who reaches it could
            # write what they load. The agents get it through Ray (start()'s
            # env), never on a command line.
            self.token = env[TOKEN_ENV] = secrets.token_hex(32)
        self.daemon = subprocess.Popen(
            argv,
            env=env,
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

    def describe(self, actor: Any) -> Any:
        return actor.describe.remote(self.args.meshrun, self.cwd, self.program.path)

    def start(self, actor: Any, node: dict[str, Any]) -> Any:
        """The node's meshrun, where the program is: the driver's directory,
        else the copy Ray shipped (the actor's own working directory).
        Call in node order: node K's agent id is the K-th."""
        agent_id = uuid.uuid4().hex
        self.agent_ids.append(agent_id)
        if node["program"]:
            return actor.start.remote(self.argv, self.env, self.cwd, agent_id)
        return actor.start.remote(self.shipped_argv, self.env, node["own_cwd"], agent_id)

    def lose(self, ray, i: int, why: str) -> None:
        """Node K left the run (its actor died or stopped answering). Its
        bundle goes to a newcomer only once its agent is known to be gone: an
        actor that stopped answering may still run an agent on the node's
        devices. So the actor is killed (its agent dies with it), and a
        reaper on the node SIGKILLs and waits for whatever of the agent is
        left; a node Ray counts as dead took its agent down with its raylet
        (NodeAgent._watch_raylet), and Ray moves its bundle elsewhere."""
        self.lost.add(i)
        ray_node = self.nodes[i]["node_id"]
        say(
            f"node{i} (Ray node {ray_node[:8]}) is lost ({why}): "
            "the run goes on as meshrun's elastic rules say"
        )
        try:
            ray.kill(self.actors[i])
        except Exception:
            pass  # gone with its node
        self.send_reaper(ray, i)

    def send_reaper(self, ray, i: int) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self.reaper is None:
            self.reaper = ray.remote(num_cpus=0, max_retries=0)(end_agent)
        self.reaping[i] = self.reaper.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.nodes[i]["node_id"], soft=False)
        ).remote(self.agent_ids[i], REAP_WAIT_S)

    def reap(self, ray) -> None:
        """Frees the bundles of lost nodes whose agent is confirmed gone; sends
        another reaper where one could not confirm it (after a pause)."""
        for i, when in list(self.reap_again.items()):
            if time.monotonic() >= when:
                del self.reap_again[i]
                self.send_reaper(ray, i)
        for i, ref in list(self.reaping.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue  # its node is slow, or unreachable: the bundle stays reserved
            del self.reaping[i]
            ray_node = self.nodes[i]["node_id"]
            try:
                gone = ray.get(ref)
                why = f"its agent outlived SIGKILL for {REAP_WAIT_S:g} s"
            except ray.exceptions.RayError as e:
                # The node died before the reaper ran there, or its worker did.
                gone = not any(n["NodeID"] == ray_node and n["Alive"] for n in ray.nodes())
                why = f"its reaper failed ({type(e).__name__})"
            if not gone:
                say(f"node{i}: {why}: its place stays reserved, trying again")
                self.reap_again[i] = time.monotonic() + 2
                continue
            if self.bundle_of[i] is not None:
                self.free_bundles.append(self.bundle_of[i])
            say(f"node{i}'s agent has ended: its place is free")

    def place_agents(self, ray, count: int) -> list[str]:
        """An actor in each bundle. Refuses nodes without meshrun; returns
        the nodes that lack the program (none once it was shipped)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.agent_class = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
        self.actors = [
            self.agent_class.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=i
                )
            ).remote()
            for i in range(count)
        ]
        try:
            self.nodes = ray.get([self.describe(a) for a in self.actors])
        except ray.exceptions.RuntimeEnvSetupError as e:
            raise LaunchError(
                f"Ray could not ship {self.program.folder}: {str(e).strip().splitlines()[-1]}"
            ) from None
        named = [
            f"node{i} ({n['hostname']}, Ray node {n['node_id'][:8]})"
            for i, n in enumerate(self.nodes)
        ]
        without = [named[i] for i, n in enumerate(self.nodes) if not n["meshrun"]]
        if without:
            raise LaunchError(
                f"{self.args.meshrun} is not on {', '.join(without)}: install meshrun there"
            )
        lacking = [named[i] for i, n in enumerate(self.nodes) if not n["program"]]
        if not lacking or self.shipped:
            return []  # those nodes run the program in their copy
        if not self.program.folder:
            raise LaunchError(
                f"{self.program.shipped_token} is not on {', '.join(lacking)}, and meshrun does "
                "not ship a program found on the PATH: install it there"
            )
        return lacking

    def start_agents(self, ray, endpoint: str) -> None:
        run_id = uuid.uuid4().hex[:12]
        self.argv = agent_argv(self.args, self.launcher_args, endpoint, run_id)
        shipped_args = self.program.shipped_args(self.launcher_args)
        self.shipped_argv = agent_argv(self.args, shipped_args, endpoint, run_id)
        self.env = forwarded_env(dict(os.environ))
        if self.token:
            self.env[TOKEN_ENV] = self.token
        self.bundle_of = list(range(len(self.actors)))
        for i, n in enumerate(self.nodes):
            say(f"node{i} is Ray node {n['node_id'][:8]} at {n['ip']} ({n['hostname']})")
        ray.get([self.start(a, n) for a, n in zip(self.actors, self.nodes, strict=True)])

    def place_newcomers(self, ray) -> None:
        """Agents for the nodes the run can gain, up to --nnodes MAX; each
        joins the run as any meshrun node does. Never waits: an actor still
        starting is looked at again on the next call.

        Two ways, the first agent to start wins the place:
        - in a lost node's bundle: Ray moves a dead node's bundles to nodes
          with room (STRICT_SPREAD: one without a bundle) once it has marked
          the node dead, and the agent starts wherever Ray puts the bundle;
        - pinned to an alive node that has room and no agent (not a lost
          one: Ray may not know yet that it died), holding the bundle's
          resources itself: at once on a spare node, and the way past the
          placement group, which cannot grow."""
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        ((kind, need),) = self.bundle.items()

        def live() -> list[int]:
            return [
                i for i in range(len(self.actors)) if i not in self.codes and i not in self.lost
            ]

        def drop(newcomer: Newcomer, why: str = "") -> None:
            ray.kill(newcomer.actor)
            if newcomer.node_id is not None:
                self.tried[newcomer.node_id] = time.monotonic()
            if newcomer.bundle is not None:
                self.free_bundles.append(newcomer.bundle)  # for a later newcomer
            if why:
                say(why)

        waiting = []
        for newcomer in self.pending:
            if len(live()) >= self.args.max_nodes:
                drop(newcomer)  # another newcomer took the place
                continue
            ready, _ = ray.wait([newcomer.described], timeout=0)
            if not ready:
                if newcomer.bundle is None and time.monotonic() - newcomer.since > NEWCOMER_START_S:
                    drop(newcomer)  # its resources are taken by other work: try again later
                else:
                    waiting.append(newcomer)
                continue
            node = (newcomer.node_id or "?")[:8]
            try:
                info = ray.get(newcomer.described)
            except ray.exceptions.RayError as e:
                # The node died meanwhile, or Ray could not ship there.
                drop(
                    newcomer,
                    f"an agent for Ray node {node} did not start: "
                    f"{str(e).strip().splitlines()[-1]}",
                )
                continue
            node = info["node_id"][:8]
            if not info["meshrun"]:
                drop(newcomer, f"Ray node {node} has no {self.args.meshrun}: no agent there")
                continue
            if not info["program"] and not self.shipped:
                drop(
                    newcomer,
                    f"Ray node {node} lacks {self.program.path or self.cwd}: no agent there "
                    "(meshrun ships the program's folder only when a node lacks it at the start)",
                )
                continue
            index = len(self.actors)
            self.actors.append(newcomer.actor)
            self.nodes.append(info)
            self.bundle_of.append(newcomer.bundle)
            self.start(newcomer.actor, info)
            say(
                f"node{index} is Ray node {node} at {info['ip']} ({info['hostname']}), "
                "new in the run: it joins"
            )
        self.pending = waiting

        room = self.args.max_nodes - len(live())
        if room <= 0:
            return
        for bundle in self.free_bundles:
            actor = self.agent_class.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=bundle
                )
            ).remote()
            self.pending.append(Newcomer(actor, self.describe(actor), time.monotonic(), bundle))
        self.free_bundles = []

        taken = {self.nodes[i]["node_id"] for i in range(len(self.actors)) if i not in self.codes}
        taken |= {n.node_id for n in self.pending}  # lost nodes stay taken
        pinned = room - sum(n.bundle is None for n in self.pending)
        for node in ray.nodes():
            node_id = node["NodeID"]
            recently = time.monotonic() - self.tried.get(node_id, -1e9) < NEWCOMER_RETRY_S
            if (
                pinned <= 0
                or not node["Alive"]
                or node_id in taken
                or recently
                or node["Resources"].get(kind, 0) < need
            ):
                continue
            actor = self.agent_class.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                **({"num_gpus": need} if kind == "GPU" else {"num_cpus": need}),
            ).remote()
            self.pending.append(
                Newcomer(actor, self.describe(actor), time.monotonic(), None, node_id)
            )
            pinned -= 1

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
                    lines, code = ray.get(actor.poll.remote(), timeout=self.poll_timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    self.lose(ray, i, type(e).__name__)
                    continue
                for line in lines:
                    self.out.write(f"[node{i}] {line}\n")
                if code is not None:
                    codes[i] = code
            self.out.flush()
            self.reap(ray)
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
        for actor in [*self.actors, *(newcomer.actor for newcomer in self.pending)]:
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
    # Ray's driver prints what the cluster reports to sys.stdout (a dead
    # raylet's last 20 log lines, among others), between the nodes' lines and
    # without a prefix: the run's lines keep the real stdout, Ray's go nowhere.
    out, sys.stdout = sys.stdout, open(os.devnull, "w")
    run = Run(args, launcher_args, out)

    def stop(signum: int, _frame: object) -> None:
        run.stopping = signum

    ray = None
    try:
        for ship in (False, True):
            ray = run.connect(ship)
            # After ray.init, which installs its own SIGTERM handler.
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            lacking = run.place_agents(ray, run.reserve(ray))
            if not lacking:
                break
            say(
                f"Ray ships {run.program.folder} to {', '.join(lacking)}, which lack "
                f"{run.program.path or run.cwd}"
            )
            run.stop(ray)
            ray.shutdown()
            ray = None
            run = Run(args, launcher_args, out)
        run.start_agents(ray, run.start_daemon(ray))
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

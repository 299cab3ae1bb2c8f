"""meshrun --ray on a Ray cluster of several nodes started on this machine.

Run under `unshare --net --pid --fork --mount-proc` (tests/CMakeLists.txt):
the cluster listens on the namespace's own loopback, and every process the
test starts (Ray's daemons, which `ray start` detaches, included) ends with
the namespace when this script, its init, exits. It still stops the cluster
with `ray stop --force` and checks that nothing of a run is left.

The cluster: a head holding no CPUs (so nothing is placed there, as on a
head node kept for Ray's own services) and three worker nodes of 2 CPUs each
(`ray start --address`, each its own Ray node with its own resources).

Cases:
  seed003   seed 003's TP + PP program on CPUs (2d_parallelism_cpu.py) with
            `meshrun --ray --nnodes=2 --nproc-per-node=2`, no address named
            (nor RAY_ADDRESS): exit code 0, each
            node's lines prefixed by its node, the ranks' lines as under
            torchrun 2 with the same layout (two torchrun agents on a c10d
            endpoint); afterwards no placement group, actor or meshrun
            process of the run is left.
  bad       no cluster at an address: one line, exit code 2, in seconds;
            --nnodes=4 on three nodes: one line naming the count, exit code
            2, nothing placed; --ray with --rdzv-endpoint: exit code 2.
  elastic   a job of --nnodes=1:3 on a cluster of two nodes: world 4, and the
            daemon's status page names each agent's Ray node; one
            node's raylet SIGKILLed: the driver says the node is lost, its
            agent goes with it, and the run re-forms on the other (world 2);
            a third node started: the driver places an agent there and the
            run re-forms with it (world 4); the run then succeeds, leaving
            nothing behind.
  shipped   a node that lacks the script's folder (a tmpfs over it in the
            node's mount namespace): `meshrun --ray` ships the folder there
            through Ray's working_dir, the script and the module beside it
            run in the copy, and the run succeeds; then a node without
            meshrun's binaries: --nnodes=3 refused in one line, exit code 2.
  sigterm   SIGTERM to `meshrun --ray` while its workers run: it exits 143
            within the agents' shutdown timeout and leaves no worker, actor
            or placement group.
  stalled   a job of --nnodes=1:2 on two nodes, polls timing out after 3 s
            (MESHRUN_RAY_POLL_TIMEOUT_S): the driver's daemon requires a
            token no command line shows (`meshrun status` without it is
            refused, with it answered); node1's actor SIGSTOPped while its
            agent runs: the driver says the node is lost, ends its agent,
            and only then places a new agent in its bundle (on the same Ray
            node); two agents never run on that node at once; the run
            re-forms with the new one (world 4) and succeeds.

Usage: ray_test.py --meshrun BIN --torchrun T --python PY --pythonpath P CASE
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from ray_cluster import Cluster, free_port, runs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SEED = os.path.join(HERE, "..", "..", "examples", "seeds", "003_tp_pp", "2d_parallelism_cpu.py")
WORKER_NODES = 3


def meshrun_processes(meshrun: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace") == meshrun:
            found.append(entry)
    return found


def launch(
    args: argparse.Namespace, flags: list[str], script: list[str], cwd: str | None = None
) -> subprocess.Popen:
    env = dict(os.environ, PYTHON_EXEC=args.python, PYTHONPATH=args.pythonpath)
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [args.meshrun, *flags, *script],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def rank_lines(text: str, prefixed: bool) -> list[str]:
    """The program's own lines (no launcher's), without the node prefix."""
    lines = []
    for line in text.splitlines():
        if prefixed:
            m = re.match(r"^\[node\d+\] (.*)$", line)
            assert m, f"a line without its node: {line!r}"
            line = m.group(1)
        if re.match(r"^(\d+ )?torch\.Size", line):
            lines.append(line)
    return sorted(lines)


def torchrun_lines(args: argparse.Namespace) -> list[str]:
    endpoint = f"127.0.0.1:{free_port()}"
    # --tee: each rank's lines whole (ranks sharing torchrun's stdout
    # interleave print()'s pieces), prefixed "[defaultN]:".
    common = [
        "--nnodes=2",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--tee=3",
        f"--rdzv_endpoint={endpoint}",
        "--rdzv_id=seed003",
        SEED,
    ]
    agents = [
        subprocess.Popen(
            [args.torchrun, *common], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for _ in range(2)
    ]
    out = ""
    for agent in agents:
        text, _ = agent.communicate(timeout=240)
        assert agent.returncode == 0, text
        out += text
    return rank_lines(re.sub(r"^\[default\d+\]:", "", out, flags=re.M), prefixed=False)


def readme_command(test: str) -> list[str]:
    """The README's command block marked "<!-- runnable by TEST", split."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(rf"<!-- runnable by {re.escape(test)}\b.*?-->\n```sh\n(.*?)```", text, re.S)
    assert m, f"README.md has no command block marked runnable by {test}"
    return shlex.split(m.group(1))


def case_seed003(args: argparse.Namespace, cluster: Cluster) -> None:
    # The README's Ray example, as written: no address, so Ray's "auto" finds
    # the cluster this machine runs (the one in this PID namespace), as on a
    # node of seed 003's cluster.
    command = readme_command("RayTest.seed003")
    assert command[0] == "meshrun" and command[-1] == os.path.relpath(SEED, ROOT), command
    run = launch(args, command[1:-1], [command[-1]], cwd=ROOT)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, f"exit {run.returncode}\n{out}\n{err}"
    nodes = set(re.findall(r"^\[(node\d+)\]", out, re.M))
    assert nodes == {"node0", "node1"}, nodes
    assert len(re.findall(r"^meshrun: --ray: node\d is Ray node ", err, re.M)) == 2, err
    ours = rank_lines(out, prefixed=True)
    theirs = torchrun_lines(args)
    assert ours == theirs, f"meshrun --ray:\n{ours}\ntorchrun:\n{theirs}"
    assert cluster.leftovers() == [], cluster.leftovers()
    assert meshrun_processes(args.meshrun) == []
    print(f"ok: {len(ours)} rank lines as torchrun's, on {sorted(nodes)}; nothing left")


def one_line_refusal(
    args, flags, script, expect: str, within_s: float, cwd: str | None = None
) -> str:
    start = time.monotonic()
    run = launch(args, flags, script, cwd)
    out, err = run.communicate(timeout=120)
    took = time.monotonic() - start
    lines = [line for line in err.splitlines() if line.strip()]
    assert run.returncode == 2, f"exit {run.returncode}: {err}"
    assert len(lines) == 1 and expect in lines[0], lines
    assert took < within_s, f"{took:.1f} s"
    return lines[0]


def case_bad(args: argparse.Namespace, cluster: Cluster) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    said = [
        one_line_refusal(
            args, [f"--ray={nowhere}", "--nnodes=2"], [SEED], f"no Ray cluster at {nowhere}", 10
        ),
        one_line_refusal(
            args,
            [f"--ray={cluster.address}", "--nnodes=4", "--nproc-per-node=2"],
            [SEED],
            "fewer than --nnodes' 4",
            60,
        ),
        one_line_refusal(
            args,
            ["--ray", "--rdzv-endpoint=127.0.0.1:1"],
            [SEED],
            "cannot be combined with --rdzv-endpoint",
            10,
        ),
    ]
    assert cluster.leftovers() == [], cluster.leftovers()
    print("ok:", " | ".join(said))


SLEEPER = """\
import os, time
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(600)
"""


def case_sigterm(args: argparse.Namespace, cluster: Cluster) -> None:
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "sleeper.py")
        with open(script, "w") as f:
            f.write(SLEEPER)
        flags = [f"--ray={cluster.address}", "--nnodes=2", "--nproc-per-node=2"]
        run = launch(args, flags, [script])
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while sum("ready" in line for line in seen) < 4:
            line = run.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(seen) + run.stderr.read()
            seen.append(line)
        start = time.monotonic()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
        took = time.monotonic() - start
    assert run.returncode == 143, f"exit {run.returncode}: {err}"
    assert took < 45, f"{took:.1f} s to stop"
    assert cluster.leftovers() == [], cluster.leftovers()
    assert meshrun_processes(args.meshrun) == []
    sleepers = [p for p in os.listdir("/proc") if p.isdigit() and runs(p, "sleeper.py")]
    assert sleepers == [], sleepers
    print(f"ok: stopped in {took:.1f} s with 143; nothing left")


WAITER = """\
import os, sys, time
env = os.environ
print(f"rank {env['RANK']} of {env['WORLD_SIZE']} ready", flush=True)
while not os.path.exists(os.path.join(sys.argv[1], "done")):
    time.sleep(0.1)
"""


class Lines:
    """A process's stdout and stderr lines, read as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import threading

        self.lines: list[str] = []
        self._lock = threading.Lock()
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_count(self, pattern: str, count: int, deadline: float) -> list[str]:
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.text(), re.M)
            if len(found) >= count:
                return found
            time.sleep(0.1)
        ours = [line for line in self.text().splitlines() if line.startswith(("[node", "meshrun"))]
        raise AssertionError(f"{count} of {pattern!r} never came:\n" + "\n".join(ours[-60:]))


def launch_waiters(
    args: argparse.Namespace, cluster: Cluster, work: str, max_nodes: int
) -> subprocess.Popen:
    """WAITER (two a node) under meshrun --ray on 1 to `max_nodes` nodes."""
    script = os.path.join(work, "waiter.py")
    with open(script, "w") as f:
        f.write(WAITER)
    flags = [
        f"--ray={cluster.address}",
        f"--nnodes=1:{max_nodes}",
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--rdzv-conf=last_call_timeout=1",
    ]
    return launch(args, flags, [script, work])


def case_elastic(args: argparse.Namespace, cluster: Cluster) -> None:
    with tempfile.TemporaryDirectory() as work:
        run = launch_waiters(args, cluster, work, max_nodes=3)
        out = Lines(run)
        deadline = time.monotonic() + 240
        try:
            out.wait_count(r"^\[node\d\] rank \d of 4 ready", 4, deadline)
            # The status page names each agent's Ray node.
            (page,) = re.findall(r"status page (http://\S+)/", out.text())
            with urllib.request.urlopen(f"{page}/api/status", timeout=30) as reply:
                status = reply.read().decode()
            for ray_node in re.findall(r"node\d is Ray node (\w+)", out.text()):
                assert f'"ray-{ray_node}_' in status, (ray_node, status[:3000])
            (victim,) = re.findall(r"node1 is Ray node (\w+)", out.text())
            cluster.kill_raylet(victim)
            out.wait_count(r"node1 \(Ray node \w+\) is lost", 1, deadline)
            out.wait_count(r"^\[node0\] rank \d of 2 ready", 2, deadline)
            cluster.add_node()
            out.wait_count(r"node2 is Ray node \w+ .*new in the run", 1, deadline)
            found = out.wait_count(r"^\[(node\d)\] rank \d of 4 ready", 8, deadline)[4:]
            assert sorted(found) == ["node0", "node0", "node2", "node2"], found
            open(os.path.join(work, "done"), "w").close()
            run.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, f"exit {run.returncode}:\n{out.text()[-5000:]}"
    assert cluster.leftovers() == [], cluster.leftovers()
    assert meshrun_processes(args.meshrun) == []
    print(
        "ok: node1's raylet killed, world 4 -> 2; node2 joined, world 4 again; "
        "the run succeeded, nothing left"
    )


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = [p.decode(errors="replace").partition("=") for p in f.read().split(b"\0") if p]
    except OSError:
        return {}
    return {name: value for name, _, value in pairs}


def parent_and_state(pid: int) -> tuple[int, str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0, ""
    return int(fields[1]), fields[0]


def node_agents(meshrun: str, label: str) -> list[int]:
    """The live meshrun agents whose node label is ``label`` (not what they
    fork, nor zombies)."""
    agents = []
    for pid in map(int, meshrun_processes(meshrun)):
        parent, state = parent_and_state(pid)
        if state in ("", "Z") or str(parent) in meshrun_processes(meshrun):
            continue
        if environ(pid).get("MESHRUN_NODE_LABEL") == label:
            agents.append(pid)
    return agents


def command_lines() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return found


def check_token(args: argparse.Namespace, endpoint: str) -> None:
    """The run's daemon wants a token: `meshrun status` without it is
    refused, with it answered; no command line holds it."""
    (daemon,) = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and runs(p, "meshrun-rdzvd") and runs(p, "--port=0")
    ]
    token = environ(daemon).get("MESHRUN_RDZV_TOKEN", "")
    assert len(token) >= 32, f"the daemon has no token: {token!r}"
    assert not [c for c in command_lines() if token in c], "the token is on a command line"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHRUN_RDZV_TOKEN")}
    status = [args.meshrun, "status", f"--rdzv-endpoint={endpoint}", "--json"]
    refused = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "token" in refused.stderr, refused
    answered = subprocess.run(
        status, env={**env, "MESHRUN_RDZV_TOKEN": token}, capture_output=True, text=True, timeout=60
    )
    assert answered.returncode == 0 and '"runs"' in answered.stdout, answered


def case_stalled(args: argparse.Namespace, cluster: Cluster) -> None:
    import threading

    with tempfile.TemporaryDirectory() as work:
        os.environ["MESHRUN_RAY_POLL_TIMEOUT_S"] = "3"
        try:
            run = launch_waiters(args, cluster, work, max_nodes=2)
        finally:
            del os.environ["MESHRUN_RAY_POLL_TIMEOUT_S"]
        out = Lines(run)
        deadline = time.monotonic() + 240
        actor = 0
        watching = threading.Event()
        most: list[list[int]] = [[]]  # the most agents seen at once on node1
        try:
            out.wait_count(r"^\[node\d\] rank \d of 4 ready", 4, deadline)
            (endpoint,) = re.findall(r"rendezvous daemon on (\S+),", out.text())
            check_token(args, endpoint)
            (victim,) = re.findall(r"node1 is Ray node (\w+)", out.text())
            (agent,) = node_agents(args.meshrun, f"ray-{victim}")
            actor, _ = parent_and_state(agent)
            assert runs(str(actor), "ray::NodeAgent"), f"{agent}'s parent {actor} is no actor"

            def watch() -> None:
                while not watching.is_set():
                    now = node_agents(args.meshrun, f"ray-{victim}")
                    if len(now) > len(most[0]):
                        most[0] = now
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            os.kill(actor, signal.SIGSTOP)  # its agent and workers run on
            out.wait_count(r"node1 \(Ray node \w+\) is lost \(GetTimeoutError\)", 1, deadline)
            out.wait_count(r"node1's agent has ended", 1, deadline)
            (newcomer,) = out.wait_count(r"node2 is Ray node (\w+) .*new in the run", 1, deadline)
            assert newcomer == victim, (newcomer, victim)  # the same node, in node1's bundle
            out.wait_count(r"^\[node2\] rank \d of 4 ready", 2, deadline)
            assert parent_and_state(agent)[1] in ("", "Z"), f"node1's agent {agent} runs on"
            open(os.path.join(work, "done"), "w").close()
            run.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            watching.set()
            if actor and parent_and_state(actor)[1] not in ("", "Z"):
                os.kill(actor, signal.SIGCONT)
            if run.poll() is None:
                run.kill()
    said = [line for line in out.text().splitlines() if line.startswith("meshrun: --ray: node")]
    lost = [i for i, line in enumerate(said) if "node1 (Ray node" in line and "is lost" in line]
    ended = [i for i, line in enumerate(said) if "node1's agent has ended" in line]
    joined = [i for i, line in enumerate(said) if "node2 is Ray node" in line]
    assert lost and ended and joined and lost[0] < ended[0] < joined[0], said
    assert len(most[0]) == 1, f"agents on node1's Ray node at once: {most[0]}"
    assert run.returncode == 0, f"exit {run.returncode}:\n{out.text()[-5000:]}"
    assert cluster.leftovers() == [], cluster.leftovers()
    assert meshrun_processes(args.meshrun) == []
    print(
        "ok: the daemon wants a token; node1's actor stopped: lost, its agent ended, "
        "then a new agent in its bundle (never two at once); the run succeeded, nothing left"
    )


GREETER = """\
import os
from helper import greeting  # beside the script: its whole folder must be there
print(f"rank {os.environ['RANK']} {greeting()} in {os.getcwd()}", flush=True)
"""


def case_shipped(args: argparse.Namespace, cluster: Cluster) -> None:
    with tempfile.TemporaryDirectory() as work:
        job = os.path.join(work, "job")
        os.mkdir(job)
        with open(os.path.join(job, "greeter.py"), "w") as f:
            f.write(GREETER)
        with open(os.path.join(job, "helper.py"), "w") as f:
            f.write("def greeting() -> str:\n    return 'hello'\n")
        cluster.add_node(hide=(work,))
        flags = [f"--ray={cluster.address}", "--nnodes=2", "--nproc-per-node=2"]
        run = launch(args, flags, ["greeter.py"], cwd=job)
        out, err = run.communicate(timeout=240)
        assert run.returncode == 0, f"exit {run.returncode}\n{out}\n{err}"
        shipping = re.findall(
            r"^meshrun: --ray: Ray ships (\S+) to node\d .*, which lack (\S+)$", err, re.M
        )
        assert shipping == [(job, os.path.join(job, "greeter.py"))], err
        greeted = re.findall(r"^\[node\d\] rank (\d) hello in (\S+)$", out, re.M)
        assert sorted(rank for rank, _ in greeted) == ["0", "1", "2", "3"], out
        copies = {cwd for _, cwd in greeted if cwd != job}
        assert len(copies) == 1 and sum(cwd == job for _, cwd in greeted) == 2, greeted
        assert cluster.leftovers() == [], cluster.leftovers()

        # A node without meshrun: refused before anything starts.
        cluster.add_node(hide=(os.path.dirname(args.meshrun),))
        refused = one_line_refusal(
            args,
            [f"--ray={cluster.address}", "--nnodes=3", "--nproc-per-node=2"],
            ["greeter.py"],
            f"{args.meshrun} is not on node",
            60,
            cwd=job,
        )
    assert cluster.leftovers() == [], cluster.leftovers()
    assert meshrun_processes(args.meshrun) == []
    print(f"ok: greeter.py's folder shipped to the node without it ({copies.pop()}); {refused}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--torchrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument(
        "case", choices=["seed003", "bad", "elastic", "sigterm", "shipped", "stalled"]
    )
    args = parser.parse_args()
    if os.getpid() != 1:
        sys.exit("ray_test.py: run it under unshare --net --pid --fork --mount-proc")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["PYTHONPATH"] = args.pythonpath  # the leftovers check imports ray only
    ray = os.path.join(os.path.dirname(args.python), "ray")
    with tempfile.TemporaryDirectory(prefix="ray-") as temp:
        nodes = {"elastic": 2, "shipped": 1, "stalled": 2}.get(args.case, WORKER_NODES)
        cluster = Cluster(ray, temp, nodes=nodes)
        cases = {
            "seed003": case_seed003,
            "bad": case_bad,
            "elastic": case_elastic,
            "sigterm": case_sigterm,
            "shipped": case_shipped,
            "stalled": case_stalled,
        }
        try:
            cases[args.case](args, cluster)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()

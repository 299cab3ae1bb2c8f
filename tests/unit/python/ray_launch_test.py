"""Tests of meshrun --ray without a Ray cluster: how an actor starts its
node's meshrun (nothing runs between fork and exec, and the child dies with
the actor), how a node's reaper ends a lost agent, and the token the driver's
daemon requires (MESHRUN_BIN: the meshrun binary, meshrun-rdzvd beside it)."""

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock
import uuid
from types import SimpleNamespace

from meshrun import ray_launch

# A threaded parent, as a Ray actor is, where loading a library after fork
# is forbidden (ctypes.CDLL raises): it starts `sleep` as an actor starts
# meshrun, says the child's pid, and waits to be killed.
PARENT = """\
import ctypes, os, sys, threading, time
from meshrun import ray_launch

def no_loading(*args, **kwargs):
    raise RuntimeError("ctypes.CDLL in the actor's process")

ctypes.CDLL = no_loading
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
child = ray_launch.spawn_dying_with_parent(["sleep", "600"], dict(os.environ), "/")
print(child.pid, flush=True)
time.sleep(600)
"""


def state(pid: int) -> str:
    """The process's state letter; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Until the process is gone or a zombie (its parent died: whoever
    reaps orphans here may not be quick)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if state(pid) in ("", "Z"):
            return True
        time.sleep(0.02)
    return False


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


class SpawnTest(unittest.TestCase):
    def test_no_library_loading_after_fork_and_child_dies_with_parent(self) -> None:
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        child = 0
        try:
            line = parent.stdout.readline()
            if not line.strip().isdigit():
                parent.kill()
                self.fail(line + parent.stderr.read())
            child = int(line)
            # The wrapper execs the program: once it runs, the kernel was asked.
            deadline = time.monotonic() + 30
            while cmdline(child)[:1] != ["sleep"]:
                self.assertLess(time.monotonic(), deadline, cmdline(child))
                time.sleep(0.02)
            self.assertEqual(cmdline(child), ["sleep", "600"])
            self.assertEqual(os.getsid(child), child)  # a session of its own
            parent.kill()
            parent.wait(timeout=30)
            self.assertTrue(wait_gone(child, 10), f"sleep {child} outlived its parent")
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait(timeout=30)
            if child and state(child) not in ("", "Z"):
                os.kill(child, signal.SIGKILL)

    def test_a_program_that_cannot_run_says_so(self) -> None:
        child = ray_launch.spawn_dying_with_parent(["/nonexistent/meshrun"], dict(os.environ), "/")
        out, _ = child.communicate(timeout=30)
        self.assertNotEqual(child.returncode, 0)
        self.assertIn(b"meshrun: --ray: cannot run /nonexistent/meshrun", out)


class ReaperTest(unittest.TestCase):
    def test_ends_every_process_of_the_agent_and_no_other(self) -> None:
        agent_id = uuid.uuid4().hex
        marked = {**os.environ, ray_launch.AGENT_ID_ENV: agent_id}
        ours = [subprocess.Popen(["sleep", "600"], env=marked) for _ in range(2)]
        other = subprocess.Popen(
            ["sleep", "600"], env={**os.environ, ray_launch.AGENT_ID_ENV: "another"}
        )
        try:
            self.assertEqual(
                sorted(ray_launch.agent_processes(agent_id)), sorted(p.pid for p in ours)
            )
            self.assertTrue(ray_launch.end_agent(agent_id, 10))
            for p in ours:
                self.assertEqual(p.wait(timeout=10), -signal.SIGKILL)
            self.assertEqual(ray_launch.agent_processes(agent_id), [])  # zombies not counted
            self.assertIsNone(other.poll())
            self.assertTrue(ray_launch.end_agent("nobody", 0))
        finally:
            for p in [*ours, other]:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)

    def test_looks_again_at_a_process_caught_in_its_exec(self) -> None:
        # Popen returns once the child's exec has closed its descriptors,
        # before the kernel has copied its environment in: read at once,
        # /proc/PID/environ was empty one time in five here (one in two under
        # load), and under CI's load the reaper missed such a process. The
        # window is too short to hit on purpose, so the scan is played here:
        # empty first, then the agent's.
        scans = iter([([], [4242]), ([], [4242]), ([4242], [])])
        with unittest.mock.patch.object(ray_launch, "_scan_processes", lambda mark: next(scans)):
            self.assertEqual(ray_launch.agent_processes("a"), [4242])
        # A process whose environment is empty for good (env -i) is given up
        # on after EXEC_WINDOW_S.
        with unittest.mock.patch.object(ray_launch, "_scan_processes", lambda mark: ([], [4242])):
            started = time.monotonic()
            self.assertEqual(ray_launch.agent_processes("a"), [])
            self.assertGreaterEqual(time.monotonic() - started, ray_launch.EXEC_WINDOW_S)

    def test_scan_tells_an_empty_environment_from_another_agent(self) -> None:
        agent_id = uuid.uuid4().hex
        ours = subprocess.Popen(
            ["sleep", "600"], env={**os.environ, ray_launch.AGENT_ID_ENV: agent_id}
        )
        bare = subprocess.Popen(["sleep", "600"], env={})
        try:
            mark = f"{ray_launch.AGENT_ID_ENV}={agent_id}".encode()
            deadline = time.monotonic() + 10
            while True:
                found, empty = ray_launch._scan_processes(mark)
                if found == [ours.pid] and bare.pid in empty:
                    break
                self.assertLess(time.monotonic(), deadline, (found, empty))
                time.sleep(0.01)
        finally:
            for p in [ours, bare]:
                p.kill()
                p.wait(timeout=10)

    def test_says_when_the_agent_outlives_it(self) -> None:
        agent_id = uuid.uuid4().hex
        sleeper = subprocess.Popen(
            ["sleep", "600"], env={**os.environ, ray_launch.AGENT_ID_ENV: agent_id}
        )
        try:
            # Only a process in uninterruptible sleep outlives SIGKILL; a
            # zero wait sees this one alive past its deadline all the same.
            self.assertFalse(ray_launch.end_agent(agent_id, 0))
        finally:
            sleeper.kill()
            sleeper.wait(timeout=10)


def meshrun_bin() -> str:
    path = os.environ.get("MESHRUN_BIN", "")
    if not os.access(path, os.X_OK):
        raise AssertionError(f"MESHRUN_BIN={path!r}: set it to the meshrun binary")
    return os.path.abspath(path)


class DaemonTokenTest(unittest.TestCase):
    """The daemon a Ray run starts (Run.start_daemon, Ray's address for this
    machine faked as 127.0.0.1) requires a token."""

    def start(self, token_file: str = "") -> ray_launch.Run:
        driver = ["--address=auto", f"--meshrun={meshrun_bin()}", "--nnodes=1"]
        driver += ["--nproc-per-node=1", f"--token-file={token_file}", "--", "job.py"]
        args, launcher_args = ray_launch.parse_args(driver)
        run = ray_launch.Run(args, launcher_args, io.StringIO())
        fake_ray = SimpleNamespace(util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
        endpoint = run.start_daemon(fake_ray)
        self.addCleanup(run.daemon.wait, 30)
        self.addCleanup(run.daemon.terminate)
        self.endpoint = endpoint
        return run

    def status(self, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
        argv = [meshrun_bin(), "status", f"--rdzv-endpoint={self.endpoint}", *flags]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    def test_a_fresh_token_by_default_for_the_daemon_and_the_agents(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHRUN_RDZV_TOKEN")}
        with unittest.mock.patch.dict(os.environ, env, clear=True):
            run = self.start()
            run.start_agents(SimpleNamespace(get=lambda refs: []), self.endpoint)  # no nodes
            endpoint = self.endpoint
            another = self.start()  # its own daemon
            self.endpoint = endpoint
        self.assertGreaterEqual(len(run.token), 32)
        self.assertEqual(run.env[ray_launch.TOKEN_ENV], run.token)  # what each actor is given
        self.assertNotEqual(another.token, run.token)  # one per run
        with open(f"/proc/{run.daemon.pid}/cmdline", "rb") as f:
            self.assertNotIn(run.token.encode(), f.read())
        refused = self.status(env)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("token", refused.stderr)
        answered = self.status({**env, ray_launch.TOKEN_ENV: run.token})
        self.assertEqual(answered.returncode, 0, answered.stderr)

    def test_the_launchs_token_file_is_the_daemons(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESHRUN_RDZV_TOKEN")}
        with tempfile.TemporaryDirectory() as work:
            token_file = os.path.join(work, "token")
            with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write("a-token-of-this-launch-0123456789\n")
            with unittest.mock.patch.dict(os.environ, env, clear=True):
                run = self.start(token_file)
            self.assertEqual(run.token, "")  # the agents have the file
            self.assertNotEqual(self.status(env).returncode, 0)
            answered = self.status(env, f"--token-file={token_file}")
            self.assertEqual(answered.returncode, 0, answered.stderr)

    def test_the_launcher_hands_its_token_file_to_the_driver(self) -> None:
        # PYTHON_EXEC=echo: the driver's command line instead of the driver.
        done = subprocess.run(
            [meshrun_bin(), "--ray=127.0.0.1:1", "--token-file=tok", "--nnodes=2", "job.py"],
            env={**os.environ, "PYTHON_EXEC": "echo"},
            cwd="/tmp",
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("--token-file=/tmp/tok ", done.stdout)


class PollTimeoutTest(unittest.TestCase):
    def test_default_and_override(self) -> None:
        self.assertEqual(ray_launch.poll_timeout_s({}), 30.0)
        self.assertEqual(ray_launch.poll_timeout_s({"MESHRUN_RAY_POLL_TIMEOUT_S": "2.5"}), 2.5)
        for bad in ("soon", "0", "-1"):
            with self.assertRaises(ray_launch.LaunchError):
                ray_launch.poll_timeout_s({"MESHRUN_RAY_POLL_TIMEOUT_S": bad})


if __name__ == "__main__":
    unittest.main()

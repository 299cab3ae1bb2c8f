"""Unit tests of meshrun --ray's node side without a Ray cluster: how an
actor starts its node's meshrun (nothing runs between fork and exec, and the
child dies with the actor) and how a node's reaper ends a lost agent."""

import os
import signal
import subprocess
import sys
import time
import unittest
import uuid

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


class PollTimeoutTest(unittest.TestCase):
    def test_default_and_override(self) -> None:
        self.assertEqual(ray_launch.poll_timeout_s({}), 30.0)
        self.assertEqual(ray_launch.poll_timeout_s({"MESHRUN_RAY_POLL_TIMEOUT_S": "2.5"}), 2.5)
        for bad in ("soon", "0", "-1"):
            with self.assertRaises(ray_launch.LaunchError):
                ray_launch.poll_timeout_s({"MESHRUN_RAY_POLL_TIMEOUT_S": bad})


if __name__ == "__main__":
    unittest.main()

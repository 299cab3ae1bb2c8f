"""Processes an e2e test launches, each ended by its pid: a launch with its
output collected line by line, and meshrun-rdzvd on kernel-assigned ports.
The tests run as scripts from this folder, so `from launched import Run`.
"""

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request


class Run:
    """One meshrun launch, its output collected; ended by its pid."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def output(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for(self, pattern: str, deadline: float) -> bool:
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            if any(regex.search(line) for line in self.output()):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def finish(self, deadline: float) -> int:
        try:
            return self.proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return -1
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=5)


class Daemon(Run):
    """meshrun-rdzvd on 127.0.0.1, kernel-assigned ports."""

    def __init__(self, meshrun: str, deadline: float) -> None:
        rdzvd = os.path.join(os.path.dirname(meshrun), "meshrun-rdzvd")
        super().__init__(
            [rdzvd, "--host=127.0.0.1", "--port=0", "--metrics-port=0", "--log-level=warn"],
            dict(os.environ),
        )
        for name in ("ENDPOINT", "METRICS"):
            if not self.wait_for(f"^MESHRUN_RDZVD_{name}=", deadline):
                raise AssertionError("meshrun-rdzvd did not start:\n" + "\n".join(self.output()))
        values = dict(line.split("=", 1) for line in self.output()[:2])
        self.endpoint = values["MESHRUN_RDZVD_ENDPOINT"]
        self.metrics = values["MESHRUN_RDZVD_METRICS"]

    def run_flags(self, run_id: str, nnodes: str, nproc: int) -> list[str]:
        """meshrun's flags for a node of run `run_id` on this daemon."""
        return [
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={run_id}",
        ]

    def waiting_at_quorum(self, run_id: str) -> int:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        sample = f'meshrun_run_step_quorum_waiting{{run="{run_id}",call="quorum"}} '
        return next((int(float(line.split()[-1])) for line in text.splitlines()
                     if line.startswith(sample)), 0)  # fmt: skip

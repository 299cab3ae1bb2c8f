"""torchrun's worker watchdog under meshrun, with torch's own client.

TORCHELASTIC_ENABLE_FILE_TIMER=1 and no TORCHELASTIC_TIMER_FILE: the agent
makes the FIFO and gives its path to the workers, which use torch's
FileTimerClient unchanged (file_timer_worker.py). Under
`meshrun --standalone --nproc-per-node=2 --max-restarts=1`:

- rank 1 hangs inside a 2 s timer: the agent kills it (SIGKILL, the
  client's default), says which timer of which rank, and the job restarts;
- on the restart, a line that is not a request and a forged, expired timer
  for a process that is not a worker are refused (both logged) and that
  process lives;
- the run succeeds within the test's bound, and the FIFO is gone.

The same job under torchrun 2 is run for comparison, and how it ended is
printed: torch's FileTimerServer kills the worker and then its own agent.

Run under `unshare --pid --fork --mount-proc`: torchrun's workers outlive
their killed agent, and the test ends them with the namespace.

Usage: file_timer_test.py --meshrun BIN --python PY --torchrun T
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "file_timer_worker.py")
BOUND_S = 120
REFUSED = "refused a timer request for pid"


def end_leftovers() -> None:
    """SIGKILLs every other process of this PID namespace (the test is its
    init): what a launcher left behind, e.g. workers whose agent was killed."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def run(command: list[str], python: str, refused_flag: str) -> tuple[int, str, float]:
    """The launcher's exit code and output, and how long it ran; whatever it
    left running is ended. Once the output has the agent's refusal of the
    forged timer, `refused_flag` is created (the worker waits for it)."""
    env = dict(
        os.environ,
        PYTHON_EXEC=python,
        TORCHELASTIC_ENABLE_FILE_TIMER="1",
        FILE_TIMER_TEST_REFUSED=refused_flag,
    )
    env.pop("TORCHELASTIC_TIMER_FILE", None)
    start = time.monotonic()
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None and time.monotonic() - start < BOUND_S:
        if not os.path.exists(refused_flag) and any(REFUSED in line for line in lines):
            open(refused_flag, "w").close()
        time.sleep(0.05)
    code = proc.poll()
    took = time.monotonic() - start
    end_leftovers()
    reader.join(timeout=30)
    assert code is not None, f"{command[0]} still ran after {BOUND_S} s:\n{''.join(lines)}"
    return code, "".join(lines), took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshrun", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--torchrun", required=True)
    args = parser.parse_args()
    if os.getpid() != 1:
        sys.exit("file_timer_test.py: run it under unshare --pid --fork --mount-proc")
    flags = ["--standalone", "--nproc-per-node=2", "--max-restarts=1"]

    with tempfile.TemporaryDirectory(prefix="file-timer-") as work:
        code, out, took = run([args.meshrun, *flags, WORKER], args.python, f"{work}/refused")
        assert code == 0, f"exit {code}\n{out}"
        (fifo,) = set(re.findall(r"serving torch's FileTimerClient at (\S+)", out)) or {None}
        assert fifo and fifo.startswith("/") and "watchdog_timer_" in fifo, out
        assert set(re.findall(r"timer file (\S+)", out)) == {fifo}, out
        killed = re.findall(
            r"worker watchdog: the timer 'hung step' of local rank 1 \(pid \d+\) expired "
            r"[\d.]+ s ago: sent SIGKILL",
            out,
        )
        assert len(killed) == 1, out
        assert "refused a line that is not a timer request" in out, out
        assert re.search(REFUSED + r" \d+, not one of this agent's", out), out
        assert "rank 0: the forged timer's process survived" in out, out
        assert sorted(re.findall(r"rank (\d): done", out)) == ["0", "1"], out
        assert not os.path.exists(fifo), f"{fifo} left behind"
        print(
            f"ok: meshrun killed the hung rank, refused the forged timer, restarted and "
            f"succeeded in {took:.1f} s"
        )

        code, out, took = run([args.torchrun, *flags, WORKER], args.python, f"{work}/unused")
        print(
            f"torchrun 2 for comparison: exit {code} after {took:.1f} s; "
            f"{'it killed its own agent' if code == -9 else 'see its output'}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

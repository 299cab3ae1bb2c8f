"""Files through which an end-to-end test and its workers take turns.

The workers import this from their own folder (a script's folder is on
sys.path): a file appears whole (written aside, then renamed), and a wait for
one has a deadline.
"""

import os
import time

DEADLINE_S = 120


def write_file(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def await_file(path: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"no {path} within {deadline_s} s")
        time.sleep(0.05)

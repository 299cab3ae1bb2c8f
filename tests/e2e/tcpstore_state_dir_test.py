"""What stock TCPStore clients write survives a SIGKILL of the daemon.

torch's own TCPStore client (the venv's torch 2) writes keys, counters,
appends and queue items to a real meshrun-rdzvd with --state-dir; the daemon
is SIGKILLed and started again on the same port with the same dir; a new
stock client reads back exactly what was written, and the store serves on.

  python3 tcpstore_state_dir_test.py --rdzvd build/bin/meshrun-rdzvd
"""

import argparse
import datetime
import signal
import subprocess
import sys
import tempfile

from torch.distributed import TCPStore


def start_daemon(rdzvd, state_dir, port):
    daemon = subprocess.Popen(
        [
            rdzvd,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--state-dir",
            state_dir,
            "--log-level",
            "warn",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = daemon.stdout.readline().strip()  # printed once it serves
    if not line.startswith("MESHRUN_RDZVD_ENDPOINT="):
        daemon.kill()
        daemon.wait(timeout=10)
        sys.exit(f"FAIL: meshrun-rdzvd printed {line!r}, not its endpoint")
    return daemon, int(line.rsplit(":", 1)[1])


def client(port):
    return TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rdzvd", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshrun-tcpstore-state-") as state_dir:
        daemon, port = start_daemon(args.rdzvd, state_dir, 0)
        try:
            store = client(port)
            store.set("/worker/attempt_0/key", "value")
            assert store.add("/worker/attempt_0/counter", 41) == 41
            assert store.add("/worker/attempt_0/counter", 1) == 42
            store.append("/worker/attempt_0/log", "a")
            store.append("/worker/attempt_0/log", "b")
            store.multi_set(["m1", "m2"], ["v1", "v2"])
            assert store.compare_set("cas", "", "first") == b"first"
            store.set("gone", "x")
            assert store.delete_key("gone")
            store.queue_push("q", "one")
            store.queue_push("q", "two")
            assert store.queue_pop("q") == b"one"
            # Every write above has been answered or was followed by an
            # answered query, so the daemon has logged it.
            assert store.num_keys() == 6
        finally:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(timeout=30)

        daemon, again = start_daemon(args.rdzvd, state_dir, port)
        try:
            assert again == port, (again, port)
            store = client(port)
            got = {
                "key": store.get("/worker/attempt_0/key"),
                "counter": store.get("/worker/attempt_0/counter"),
                "log": store.get("/worker/attempt_0/log"),
                "multi": store.multi_get(["m1", "m2"]),
                "cas": store.get("cas"),
                "gone": store.check(["gone"]),
                "queue_len": store.queue_len("q"),
                "queue": store.queue_pop("q"),
                "num_keys": store.num_keys(),
            }
            expected = {
                "key": b"value",
                "counter": b"42",
                "log": b"ab",
                "multi": [b"v1", b"v2"],
                "cas": b"first",
                "gone": False,
                "queue_len": 1,
                "queue": b"two",
                "num_keys": 6,
            }
            if got != expected:
                sys.exit(f"FAIL: after the restart the store held {got}, expected {expected}")
            assert store.add("/worker/attempt_0/counter", 1) == 43  # and serves on
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
    print("PASS: a stock TCPStore client's writes survived SIGKILL and restart")


if __name__ == "__main__":
    main()

"""c10d TCPStore wire-protocol conformance: torch's servers vs meshrun's.

The same cases run, through stock clients only, against
  torch-libuv    torch's TCPStore server, libuv backend (torch 2's default),
  torch-classic  torch's TCPStore server, classic backend (use_libuv=False),
  meshrun        meshrun-rdzvd's TCPStore protocol server (on its gRPC port),
  meshrun-agent  an agent's store relay (store_relay_tool: what workers
                 under meshrun talk to) to a meshrun-rdzvd of its own,
each torch server hosted by a python subprocess of its own (port 0, which it
prints), the daemon started with --port 0. Clients:
  python  torch.distributed.TCPStore(host, port, is_master=False) in this
          process (threads, one client object each) plus raw sockets for the
          garbage cases and a subprocess for the client killed mid-wait;
  cpp     tcpstore_client_conformance (c10d::TCPStore from libtorch).
Every case yields a JSON-serialisable outcome; outcomes are compared as data.

Each case uses keys under a prefix of its own and fresh client objects (a
client that met a timeout or a closed connection is never reused by another
case): all cases of a server share that one server, as stock clients of a
daemon with no run share its one default namespace. "fresh_server" runs first
and sees the server as its clients find it.

Which outcome meshrun must give: torch-libuv's, except where the two torch
backends differ (TORCH_BACKEND_DIFFERENCES below, each explained); there the
case names the backend meshrun must match. Outside those, the two torch
backends must agree with each other, or the suite fails too.

Usage:
  tcpstore_conformance.py --server torch-libuv|torch-classic|meshrun [--rdzvd BIN]
  tcpstore_conformance.py --server meshrun-agent --rdzvd BIN --relay BIN
  tcpstore_conformance.py --server all --rdzvd BIN --relay BIN  (compare; exit 1 on a difference)
  ... [--client python|cpp] [--cpp-client BIN] [--rdzvd-threads N] [--case NAME ...] [--json OUT]
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# c10d's client looks up its socket's hostname (getnameinfo) for its logs, and
# where the DNS server drops the query that costs the resolver's full timeout
# (5 s; "The hostname of the client socket cannot be retrieved. err=-3") for a
# connect. Fail such lookups after 1 s: the clients, the servers and the C++
# client inherit this before any resolver starts.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")

PYTHON = sys.executable
HOST = "127.0.0.1"
SERVERS = ["torch-libuv", "torch-classic", "meshrun", "meshrun-agent"]
MESHRUN_SERVERS = ["meshrun", "meshrun-agent"]
START_DEADLINE_S = 60  # a server (importing torch on a loaded machine) or the daemon
CLIENT_TIMEOUT = datetime.timedelta(seconds=20)  # a broken server fails a case, never hangs it
SHORT = datetime.timedelta(milliseconds=300)  # timeouts the cases provoke
PARK_DEADLINE_S = 20  # a blocking call must be seen parked in the server by then
JOIN_DEADLINE_S = 20  # a released blocking call must return by then
ALL_DEADLINE_S = 240  # one server's whole run, in --server all

# Wire protocol (torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp, as
# installed with torch): one QueryType byte, then the query's fields.
VALIDATE, SET, PING = 0, 1, 13
MAGIC = 0x3C85F7CE

# The two torch backends differ on these cases; meshrun must match the one
# named (and the difference is what the explanation says).
TORCH_BACKEND_DIFFERENCES = {
    "large_value_64mib": (
        "torch-classic",
        "libuv's server refuses a payload over its 8 MiB limit and closes the connection "
        "(the client sees DistNetworkError); the classic server stores and returns 64 MiB; "
        "meshrun supports 64 MiB, as the classic one",
    ),
    "queue": (
        "torch-libuv",
        "the classic server has no queue queries: it closes the connection at the first "
        "(DistNetworkError); libuv implements queue_push/pop/len",
    ),
    "queue_pop_blocks_until_push": ("torch-libuv", "as 'queue'"),
    "queue_name_reads": ("torch-libuv", "as 'queue'"),
    "parked_get_and_wait_then_queue_push": ("torch-libuv", "as 'queue'"),
    "libuv_limits": (
        "torch-libuv",
        "libuv's server closes the connection of a key over 8 KiB or a query of more than "
        "128 Ki keys; the classic server has no such limit; meshrun has libuv's",
    ),
}
# Garbage on the socket: the classic server closes the connection at once;
# libuv's keeps it open (still open at the 8 s deadline) when the garbage comes before a
# valid VALIDATE, closing only on an unknown query after one. meshrun must close.
for _name in ("garbage_raw_bytes", "garbage_wrong_magic", "garbage_query_before_validate"):
    TORCH_BACKEND_DIFFERENCES[_name] = (
        "torch-classic",
        "libuv's server leaves a connection that sent garbage before a valid VALIDATE open "
        "(8 s later); the classic server closes it; meshrun must close it, as the classic",
    )


# --------------------------------------------------------------------------
# Servers, each ended by its pid.


def read_line_with_deadline(proc, prefix, deadline_s):
    """The value after `prefix` on the first stdout line carrying it."""
    end = time.monotonic() + deadline_s
    buf = b""
    fd = proc.stdout.fileno()
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text.startswith(prefix):
                return text[len(prefix) :]
    return None


def end_process(proc):
    """SIGKILL by pid (if still running) and reap, bounded."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for f in (proc.stdin, proc.stdout):
        if f:
            f.close()


TORCH_SERVER = r"""
import datetime, sys
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv={libuv}, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
assert store.libuvBackend == {libuv}
print("PORT=%d" % store.port, flush=True)
sys.stdin.read()  # serves until the harness closes stdin (or kills it by pid)
"""


class Server:
    def __init__(self, kind, rdzvd, relay=None, rdzvd_threads=0):
        self.kind = kind
        self.procs = []
        try:
            if kind in MESHRUN_SERVERS:
                if not rdzvd:
                    raise SystemExit("--rdzvd is required for the %s server" % kind)
                cmd = [rdzvd, "--host", HOST, "--port", "0"]
                if rdzvd_threads:
                    cmd += ["--tcpstore-threads", str(rdzvd_threads)]
                endpoint = self.start(cmd, "MESHRUN_RDZVD_ENDPOINT=")
                if kind == "meshrun-agent":
                    if not relay:
                        raise SystemExit("--relay is required for the meshrun-agent server")
                    endpoint = self.start(
                        [relay, endpoint, "conformance"], "MESHRUN_RELAY_ENDPOINT="
                    )
            else:
                libuv = "True" if kind == "torch-libuv" else "False"
                endpoint = self.start([PYTHON, "-c", TORCH_SERVER.format(libuv=libuv)], "PORT=")
        except BaseException:
            self.stop()
            raise
        self.port = int(endpoint.rsplit(":", 1)[-1])

    def start(self, cmd, prefix):
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.procs.append(proc)
        value = read_line_with_deadline(proc, prefix, START_DEADLINE_S)
        if value is None:
            raise RuntimeError(
                "%s did not report its port within %d s" % (cmd[0], START_DEADLINE_S)
            )
        return value

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        for proc in reversed(self.procs):
            end_process(proc)


# --------------------------------------------------------------------------
# Outcome encoding.

ADDRESS = re.compile(r"\[?[0-9a-fA-F.:]*\]?:\d{2,5}\b|127\.0\.0\.1|localhost")


def val(b):
    """bytes as JSON: text where printable, hex otherwise, digest when long."""
    if b is None:
        return None
    if len(b) > 256:
        return {"len": len(b), "sha256": hashlib.sha256(b).hexdigest()[:16]}
    try:
        text = b.decode("ascii")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "hex:" + b.hex()


def err(e):
    """An exception as data: its class, and for store errors (the client's own
    text: a timeout, an empty queue) the first line with addresses masked.
    Network errors keep the class only: reset vs EOF is a race, not behaviour."""
    out = {"error": type(e).__name__}
    if type(e).__name__ != "DistNetworkError":
        out["msg"] = ADDRESS.sub("<addr>", str(e).splitlines()[0] if str(e) else "")
    return out


def attempt(fn):
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        return err(e)
    if isinstance(r, bytes):
        return val(r)
    if isinstance(r, list):
        return [val(x) if isinstance(x, bytes) else x for x in r]
    return r


# --------------------------------------------------------------------------
# Watching a blocked call: a client parked in a blocking query sits in poll()
# (or recv) on its socket; seeing the thread there is the condition waited on.

PARKED_SYSCALLS = {7, 45, 47, 232, 271, 281}  # poll recvfrom recvmsg epoll_wait ppoll epoll_pwait


def parked(pid, tid):
    try:
        with open("/proc/%d/task/%d/syscall" % (pid, tid)) as f:
            first = f.read().split()[0]
    except (OSError, IndexError):
        return False
    return first.isdigit() and int(first) in PARKED_SYSCALLS


def wait_parked(pid, tid, deadline_s=PARK_DEADLINE_S, returned=lambda: False):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not returned():
        if parked(pid, tid):
            return True
        time.sleep(0.005)
    return False


class Blocked:
    """Runs fn(store) on a thread of its own; records its result."""

    def __init__(self, store, fn):
        self.result = None
        self.tid = None
        self.done = threading.Event()
        started = threading.Event()

        def run():
            self.tid = threading.get_native_id()
            started.set()
            self.result = attempt(lambda: fn(store))
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(JOIN_DEADLINE_S)

    def wait_parked(self):
        return wait_parked(os.getpid(), self.tid, returned=self.done.is_set)

    def join(self):
        return self.done.wait(JOIN_DEADLINE_S)


# --------------------------------------------------------------------------
# The cases (python client).

CASES = []


def case(fn):
    CASES.append((fn.__name__, fn))
    return fn


class Ctx:
    def __init__(self, server, name):
        self.server = server
        self.port = server.port
        self.p = name + "/"

    def client(self, timeout=CLIENT_TIMEOUT):
        import torch.distributed as dist

        return dist.TCPStore(HOST, self.port, is_master=False, timeout=timeout)

    def short_client(self):
        """A client whose store timeout is SHORT. It connects with the long
        timeout first: the constructor's connect, validate and ping are bound
        by its timeout too, and on a loaded machine they can take longer than
        SHORT (the CI run saw a case's outcome change that way)."""
        c = self.client()
        c.set_timeout(SHORT)
        return c

    def clients(self, n):
        """n clients connected at once (in this sandbox a connect now and then
        stalls for seconds; one at a time, the stalls would add up)."""
        out = [None] * n

        def connect(i):
            out[i] = self.client()

        threads = [threading.Thread(target=connect, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(CLIENT_TIMEOUT.total_seconds() + JOIN_DEADLINE_S)
        if any(c is None for c in out):
            raise RuntimeError("%d of %d clients did not connect" % (out.count(None), n))
        return out

    def serves_others(self):
        """A new stock client can still set and read back a value."""

        def rt():
            c = self.client()
            c.set(self.p + "probe", "alive")
            return c.get(self.p + "probe")

        return attempt(rt) == "alive"


@case
def fresh_server(x):
    c = x.client()
    return {"num_keys": attempt(c.num_keys), "list_keys": attempt(c.list_keys)}


@case
def connect_ping(x):
    # A stock client's constructor validates (magic) and pings.
    c = x.client()
    return {
        "connected": True,
        "libuvBackend_attr": attempt(lambda: c.libuvBackend),
        "has_extended_api": attempt(c.has_extended_api),
    }


@case
def raw_validate_ping(x):
    s = socket.create_connection((HOST, x.port), timeout=10)
    try:
        s.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, 0x1234ABCD))
        got = b""
        while len(got) < 4:
            chunk = s.recv(4 - len(got))
            if not chunk:
                break
            got += chunk
        return {"echo": got == struct.pack("<I", 0x1234ABCD), "reply_len": len(got)}
    finally:
        s.close()


@case
def set_get(x):
    c, p = x.client(), x.p
    return {
        "plain": attempt(lambda: (c.set(p + "a", "1"), c.get(p + "a"))[1]),
        "overwrite": attempt(lambda: (c.set(p + "a", "2"), c.get(p + "a"))[1]),
        "bytes_value": attempt(lambda: (c.set(p + "b", b"\x00\xff\x00"), c.get(p + "b"))[1]),
        "empty_value": attempt(lambda: (c.set(p + "e", ""), c.get(p + "e"))[1]),
        "unicode_key": attempt(lambda: (c.set(p + "ключ/ü", "v"), c.get(p + "ключ/ü"))[1]),
        "long_key": attempt(lambda: (c.set(p + "k" * 4000, "v"), c.get(p + "k" * 4000))[1]),
        "value_4mib": attempt(lambda: (c.set(p + "m", b"x" * (4 << 20)), c.get(p + "m"))[1]),
        "other_client_sees": attempt(lambda: x.client().get(p + "a")),
    }


@case
def get_missing_times_out(x):
    c = x.short_client()
    return {"get": attempt(lambda: c.get(x.p + "missing"))}


@case
def client_usable_after_timeout(x):
    # The client cancels its timed-out wait (CANCEL_WAIT); the server must
    # answer that so the next query's reply is the next one read.
    c = x.client()
    c.set_timeout(SHORT)
    first = attempt(lambda: c.get(x.p + "missing"))
    second = attempt(lambda: c.wait([x.p + "missing2"], SHORT))
    c.set_timeout(CLIENT_TIMEOUT)
    return {
        "first": first,
        "second": second,
        "then_set_get": attempt(lambda: (c.set(x.p + "k", "v"), c.get(x.p + "k"))[1]),
        "then_add": attempt(lambda: c.add(x.p + "n", 3)),
        "then_late_key_then_get": attempt(
            lambda: (x.client().set(x.p + "missing", "late"), c.get(x.p + "missing"))[1]
        ),
    }


@case
def add(x):
    c, p = x.client(), x.p
    return {
        "absent": attempt(lambda: c.add(p + "n", 5)),
        "negative": attempt(lambda: c.add(p + "n", -2)),
        "zero": attempt(lambda: c.add(p + "n", 0)),
        "get_after": attempt(lambda: c.get(p + "n")),
        "on_set_integer": attempt(lambda: (c.set(p + "s", "7"), c.add(p + "s", 1))[1]),
        "large": attempt(lambda: c.add(p + "big", 2**62)),
        "get_large": attempt(lambda: c.get(p + "big")),
    }


@case
def add_non_integer(x):
    c = x.client()
    c.set(x.p + "s", "abc")
    return {
        "add": attempt(lambda: c.add(x.p + "s", 1)),
        "same_client_after": attempt(lambda: c.get(x.p + "s")),
        "serves_others": x.serves_others(),
        "value_kept": attempt(lambda: x.client().get(x.p + "s")),
    }


@case
def compare_set(x):
    c, p = x.client(), x.p
    out = {
        "absent_expected_empty": attempt(lambda: c.compare_set(p + "a", "", "new")),
        "absent_expected_empty_get": attempt(lambda: c.get(p + "a")),
        "absent_expected_nonempty": attempt(lambda: c.compare_set(p + "b", "old", "new")),
        "absent_expected_nonempty_check": attempt(lambda: c.check([p + "b"])),
    }
    c.set(p + "c", "cur")
    out["present_equal"] = attempt(lambda: c.compare_set(p + "c", "cur", "next"))
    out["present_equal_get"] = attempt(lambda: c.get(p + "c"))
    out["present_different"] = attempt(lambda: c.compare_set(p + "c", "nope", "other"))
    out["present_different_get"] = attempt(lambda: c.get(p + "c"))
    c.set(p + "d", "")
    out["present_empty_expected_empty"] = attempt(lambda: c.compare_set(p + "d", "", "z"))
    out["present_empty_expected_empty_get"] = attempt(lambda: c.get(p + "d"))
    out["desired_empty"] = attempt(lambda: c.compare_set(p + "c", "next", ""))
    out["desired_empty_get"] = attempt(lambda: c.get(p + "c"))
    return out


@case
def check(x):
    c, p = x.client(), x.p
    c.set(p + "a", "1")
    return {
        "empty_list": attempt(lambda: x.client().check([])),  # a client of its own
        "present": attempt(lambda: c.check([p + "a"])),
        "present_and_absent": attempt(lambda: c.check([p + "a", p + "z"])),
        "absent": attempt(lambda: c.check([p + "z"])),
    }


@case
def wait_timeout(x):
    c = x.client()
    return {
        "one_key": attempt(lambda: c.wait([x.p + "a"], SHORT)),
        "two_keys": attempt(lambda: x.client().wait([x.p + "a", x.p + "b"], SHORT)),
        "default_timeout": attempt(lambda: x.short_client().wait([x.p + "a"])),
        "empty_list": attempt(lambda: x.client().wait([], SHORT)),
        "present_returns": attempt(
            lambda: (x.client().set(x.p + "c", "1"), x.client().wait([x.p + "c"], SHORT))[1]
        ),
    }


@case
def delete_key(x):
    c, p = x.client(), x.p
    c.set(p + "a", "1")
    return {
        "present": attempt(lambda: c.delete_key(p + "a")),
        "again": attempt(lambda: c.delete_key(p + "a")),
        "absent": attempt(lambda: c.delete_key(p + "never")),
        "check_after": attempt(lambda: c.check([p + "a"])),
        "counter_deleted_then_add": attempt(
            lambda: (c.add(p + "n", 4), c.delete_key(p + "n"), c.add(p + "n", 1))[2]
        ),
    }


@case
def num_keys_and_list_keys(x):
    c, p = x.client(), x.p
    n0 = c.num_keys()
    c.set(p + "a", "1")
    c.add(p + "b", 1)
    c.multi_set([p + "c", p + "d"], ["3", "4"])
    n1 = c.num_keys()
    c.delete_key(p + "a")
    n2 = c.num_keys()
    keys = attempt(c.list_keys)
    mine = sorted(k for k in keys if k.startswith(p)) if isinstance(keys, list) else keys
    return {"delta_after_4": n1 - n0, "delta_after_delete": n2 - n0, "list_keys_mine": mine}


@case
def multi_get_set(x):
    c, p = x.client(), x.p
    return {
        "multi_set_then_get": attempt(
            lambda: (
                c.multi_set([p + "a", p + "b"], ["1", b"\x00"]),
                c.multi_get([p + "a", p + "b"]),
            )[1]
        ),
        "overwrite": attempt(lambda: (c.multi_set([p + "a"], ["9"]), c.get(p + "a"))[1]),
        "empty_multi_set": attempt(lambda: x.client().multi_set([], [])),  # clients of their own
        "empty_multi_get": attempt(lambda: x.client().multi_get([])),
        "duplicate_keys": attempt(lambda: c.multi_get([p + "a", p + "a"])),
        "missing_times_out": attempt(lambda: x.short_client().multi_get([p + "a", p + "zz"])),
    }


@case
def append(x):
    c, p = x.client(), x.p
    return {
        "absent_creates": attempt(lambda: (c.append(p + "a", "x"), c.get(p + "a"))[1]),
        "present_appends": attempt(lambda: (c.append(p + "a", "yz"), c.get(p + "a"))[1]),
        "to_counter": attempt(
            lambda: (c.add(p + "n", 41), c.append(p + "n", "0"), c.add(p + "n", 1))[2]
        ),
    }


@case
def queue(x):
    c, p = x.client(), x.p
    return {
        "len_absent": attempt(lambda: c.queue_len(p + "q")),
        "push3": attempt(lambda: [c.queue_push(p + "q", v) for v in ("a", "b", "c")] and None),
        "len": attempt(lambda: c.queue_len(p + "q")),
        "pop": attempt(lambda: c.queue_pop(p + "q")),
        "pop_nonblocking": attempt(lambda: c.queue_pop(p + "q", block=False)),
        "check": attempt(lambda: c.check([p + "q"])),
        "wait": attempt(lambda: c.wait([p + "q"], SHORT)),
        "len_after": attempt(lambda: c.queue_len(p + "q")),
        "drain": attempt(lambda: c.queue_pop(p + "q")),
        "empty_nonblocking": attempt(lambda: x.client().queue_pop(p + "q", block=False)),
        "empty_blocking_times_out": attempt(lambda: x.short_client().queue_pop(p + "q")),
        "serves_others": x.serves_others(),
    }


@case
def queue_pop_blocks_until_push(x):
    pusher, p = x.client(), x.p
    b = Blocked(x.client(), lambda s: s.queue_pop(p + "q"))
    was_parked = b.wait_parked()
    pushed = attempt(lambda: pusher.queue_push(p + "q", "item"))
    returned = b.join()
    return {"parked": was_parked, "pushed": pushed, "returned": returned, "popped": b.result}


@case
def get_blocks_until_set(x):
    setter, p = x.client(), x.p
    b = Blocked(x.client(), lambda s: s.get(p + "k"))
    was_parked = b.wait_parked()
    setter.set(p + "k", "v")
    return {"parked": was_parked, "returned": b.join(), "got": b.result}


@case
def wait_returns_on_last_key(x):
    setter, p = x.client(), x.p
    keys = [p + "k1", p + "k2", p + "k3"]
    b = Blocked(x.client(), lambda s: s.wait(keys, CLIENT_TIMEOUT))
    out = {"parked": b.wait_parked()}
    setter.set(keys[0], "1")
    setter.add(keys[1], 1)
    setter.get(keys[1])  # a round trip after both: a wrong wake-up would be on its way
    out["still_parked_after_2_of_3"] = parked(os.getpid(), b.tid) and not b.done.is_set()
    setter.set(keys[2], "3")
    out["returned"] = b.join()
    out["result"] = b.result
    return out


@case
def many_waiters_one_set(x):
    p = x.p
    waiters = [Blocked(c, lambda s: s.get(p + "k")) for c in x.clients(16)]
    all_parked = all([w.wait_parked() for w in waiters])
    x.client().set(p + "k", "go")
    return {
        "parked": all_parked,
        "returned": all([w.join() for w in waiters]),
        "results": sorted(set(json.dumps(w.result) for w in waiters)),
    }


@case
def concurrent_add_64_clients(x):
    n_clients, n_adds, key = 64, 20, x.p + "counter"
    clients = x.clients(n_clients)
    start = threading.Barrier(n_clients)
    returned = [[] for _ in range(n_clients)]
    errors = []

    def run(i):
        try:
            start.wait(JOIN_DEADLINE_S)
            for _ in range(n_adds):
                returned[i].append(clients[i].add(key, 1))
        except Exception as e:  # noqa: BLE001
            errors.append(err(e))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n_clients)]
    for t in threads:
        t.start()
    end = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    all_values = sorted(v for r in returned for v in r)
    return {
        "finished": not any(t.is_alive() for t in threads),
        "errors": errors[:3],
        "final": attempt(lambda: x.client().add(key, 0)),
        "each_value_once": all_values == list(range(1, n_clients * n_adds + 1)),
    }


@case
def barrier(x):
    p = x.p
    b = [Blocked(c, lambda s: s.barrier(p + "b", 3, CLIENT_TIMEOUT)) for c in x.clients(3)]
    done = all([t.join() for t in b])
    keys = attempt(x.client().list_keys)
    return {
        "returned": done,
        "results": [t.result for t in b],
        "keys_left": sorted(k for k in keys if k.startswith(p)) if isinstance(keys, list) else keys,
        "short_times_out": attempt(lambda: x.client().barrier(p + "c", 2, SHORT)),
        "world_1": attempt(lambda: x.client().barrier(p + "d", 1)),
    }


@case
def queue_name_reads(x):
    """A wait or check sees a queue's item; a get of the name reads no value."""
    c, p = x.client(), x.p
    c.queue_push(p + "q", "item")
    return {
        "wait": attempt(lambda: c.wait([p + "q"], SHORT)),
        "check": attempt(lambda: c.check([p + "q"])),
        "get": attempt(lambda: x.short_client().get(p + "q")),
        "multi_get": attempt(lambda: x.short_client().multi_get([p + "q"])),
        "len": attempt(lambda: c.queue_len(p + "q")),
        "serves_others": x.serves_others(),
    }


@case
def parked_get_and_wait_then_queue_push(x):
    pusher, p = x.client(), x.p
    getter = Blocked(x.client(), lambda s: s.get(p + "g"))
    waiter = Blocked(x.client(), lambda s: s.wait([p + "w"], CLIENT_TIMEOUT))
    out = {"parked": getter.wait_parked() and waiter.wait_parked()}
    pusher.queue_push(p + "g", "item")
    pusher.queue_push(p + "w", "item")
    out.update(
        {
            "get_returned": getter.join(),
            "get": getter.result,
            "wait_returned": waiter.join(),
            "wait": waiter.result,
            "serves_others": x.serves_others(),
        }
    )
    return out


@case
def libuv_limits(x):
    p = x.p
    at_limit = p + "k" * (8192 - 1 - len(p))  # the client adds a leading "/"
    c = x.client()
    return {
        "key_8_kib": attempt(lambda: (c.set(at_limit, "v"), c.get(at_limit))[1]),
        "key_over_8_kib": attempt(lambda: x.client().check([at_limit + "k"])),
        "check_128_ki_keys": attempt(
            lambda: x.client().check(["%sm%d" % (p, i) for i in range(128 << 10)])
        ),
        "check_over_128_ki_keys": attempt(
            lambda: x.client().check(["%sm%d" % (p, i) for i in range((128 << 10) + 1)])
        ),
        "serves_others": x.serves_others(),
    }


@case
def barrier_world_size_zero_or_less(x):
    c, p = x.client(), x.p
    return {
        "zero": attempt(lambda: c.barrier(p + "b", 0, SHORT)),
        "negative": attempt(lambda: c.barrier(p + "b", -3, SHORT)),
        "arrivals": attempt(lambda: c.get(p + "b")),
    }


@case
def add_reads_a_leading_integer(x):
    """As std::stoll reads it: '12abc' is 12; no leading integer closes."""
    p = x.p
    out = {}
    for name, stored in (
        ("trailing_text", "12abc"),
        ("blanks", " 7"),
        ("sign", "-5x"),
        ("no_integer", "abc"),
    ):
        c = x.client()
        out[name] = attempt(
            lambda c=c, name=name, stored=stored: (c.set(p + name, stored), c.add(p + name, 1))[1]
        )
    out["serves_others"] = x.serves_others()
    return out


@case
def large_value_64mib(x):
    value = os.urandom(64 << 20)
    c = x.client()
    out = {"set": attempt(lambda: c.set(x.p + "big", value))}
    # SET has no reply: a round trip on the same connection orders it before
    # the other client's queries.
    out["setter_check"] = attempt(lambda: c.check([x.p + "big"]))
    reader = x.client()
    out["check"] = attempt(lambda: reader.check([x.p + "big"]))
    got = reader.get(x.p + "big") if out["check"] is True else None
    out["get_matches"] = got == value if got is not None else None
    out["serves_others"] = x.serves_others()
    return out


VANISHING_CLIENT = r"""
import datetime, sys
import torch.distributed as dist
c = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                  timeout=datetime.timedelta(seconds=120))
c.set(sys.argv[2] + "ready", "1")
print("READY", flush=True)
c.wait([sys.argv[2] + "never"])
print("RETURNED", flush=True)
"""


@case
def client_killed_mid_wait(x):
    p = x.p
    proc = subprocess.Popen(
        [PYTHON, "-c", VANISHING_CLIENT, str(x.port), p],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = read_line_with_deadline(proc, "READY", START_DEADLINE_S) is not None
        # Another waiter on the same key, started only now and with a long
        # timeout: its client's clock must not run out while the subprocess
        # imports torch and is watched (tens of seconds on a loaded machine;
        # the CI run saw it time out after 20 s).
        other = Blocked(x.client(datetime.timedelta(seconds=120)), lambda s: s.get(p + "never"))
        # The subprocess's only thread, blocked on its socket after READY, has sent its WAIT.
        was_parked = ready and wait_parked(
            proc.pid, proc.pid, returned=lambda: proc.poll() is not None
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        end_process(proc)
    out = {
        "ready": ready,
        "parked": was_parked and other.wait_parked(),
        "serves_others": x.serves_others(),
    }
    out["set_waited_key"] = attempt(lambda: x.client().set(p + "never", "now"))
    out["other_waiter_returned"] = other.join()
    out["other_waiter_got"] = other.result
    out["serves_others_after"] = x.serves_others()
    return out


def raw_exchange(port, payload, close_ourselves=False, deadline_s=8):
    """Sends raw bytes; 'closed' if the server closes the connection before
    the deadline, 'open' if it is still open then, 'replied' if it sent bytes."""
    s = socket.create_connection((HOST, port), timeout=deadline_s)
    try:
        s.sendall(payload)
        if close_ourselves:
            return "sent"
        try:
            got = s.recv(64)
        except ConnectionResetError:
            return "closed"
        except TimeoutError:
            return "open"
        return "closed" if not got else "replied"
    finally:
        s.close()


def garbage_case(payload, close_ourselves=False):
    def run(x):
        return {
            "connection": attempt(lambda: raw_exchange(x.port, payload, close_ourselves)),
            "serves_others": x.serves_others(),
        }

    return run


for _name, _payload, _close in [
    ("garbage_raw_bytes", b"\xde\xad\xbe\xef" * 16, False),
    ("garbage_wrong_magic", struct.pack("<BI", VALIDATE, 0xDEADBEEF), False),
    (
        "garbage_query_before_validate",
        struct.pack("<BQ", SET, 1) + b"k" + struct.pack("<Q", 1) + b"v",
        False,
    ),
    ("garbage_unknown_query_type", struct.pack("<BI", VALIDATE, MAGIC) + b"\xfe", False),
    (
        "garbage_truncated_then_close",
        struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BQ", SET, 100) + b"short",
        True,
    ),
]:
    _fn = garbage_case(_payload, _close)
    _fn.__name__ = _name
    case(_fn)


def run_python_cases(server, names):
    results = {}
    for name, fn in CASES:
        if names and name not in names:
            continue
        t0 = time.monotonic()
        try:
            results[name] = fn(Ctx(server, name))
        except Exception as e:  # noqa: BLE001 - a case that broke is an outcome too
            results[name] = {"case_failed": err(e)}
        if not server.alive():
            results[name] = {"server_died": True, "before": results[name]}
        print("  %-32s %5.2fs" % (name, time.monotonic() - t0), file=sys.stderr, flush=True)
        if not server.alive():
            break
    return results


def run_cpp_cases(server, cpp_client, names):
    cmd = [cpp_client, "--host", HOST, "--port", str(server.port)] + list(names)
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        end_process(proc)
        return {"cpp_client": "timed out after 120 s"}
    results = {}
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("CASE "):
            name, _, payload = line[5:].partition(" ")
            results[name] = json.loads(payload)
    if proc.returncode != 0:
        results["cpp_client_exit"] = proc.returncode
    return results


def run_server(kind, args):
    print("== %s (%s client)" % (kind, args.client), file=sys.stderr, flush=True)
    server = Server(kind, args.rdzvd, args.relay, args.rdzvd_threads)
    try:
        if args.client == "cpp":
            return run_cpp_cases(server, args.cpp_client, args.case)
        return run_python_cases(server, args.case)
    finally:
        server.stop()


def run_all_in_parallel(args):
    """Each server's cases in a child process of this script (ended by pid):
    they wait on torch imports and deadlines, not on the CPU, so three run at
    once in about the time of one."""
    with tempfile.TemporaryDirectory(prefix="tcpstore_conformance.") as tmp:
        children = {}
        for kind in SERVERS:
            cmd = [
                PYTHON,
                os.path.abspath(__file__),
                "--server",
                kind,
                "--client",
                args.client,
                "--json",
                os.path.join(tmp, kind + ".json"),
            ]
            for flag, value in (
                ("--rdzvd", args.rdzvd),
                ("--relay", args.relay),
                ("--cpp-client", args.cpp_client),
            ):
                if value:
                    cmd += [flag, value]
            if args.rdzvd_threads:
                cmd += ["--rdzvd-threads", str(args.rdzvd_threads)]
            for name in args.case:
                cmd += ["--case", name]
            children[kind] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(tmp, kind + ".log"), "w"),
            )
        end = time.monotonic() + ALL_DEADLINE_S
        results = {}
        for kind, child in children.items():
            try:
                child.wait(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            end_process(child)
            with open(os.path.join(tmp, kind + ".log")) as f:
                log = [line for line in f.read().splitlines() if line.startswith(("==", "  "))]
            print("\n".join(log), file=sys.stderr)
            try:
                with open(os.path.join(tmp, kind + ".json")) as f:
                    results.update(json.load(f))
            except (OSError, ValueError):
                results[kind] = {"harness": "no outcomes (exit %s)" % child.returncode}
        return results


# --------------------------------------------------------------------------
# Comparison.


def short(outcome):
    text = json.dumps(outcome, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def compare(all_results):
    names = []
    for results in all_results.values():
        for n in results:
            if n not in names:
                names.append(n)
    failures = []
    rows = []
    for n in names:
        libuv = all_results["torch-libuv"].get(n, "<missing>")
        classic = all_results["torch-classic"].get(n, "<missing>")
        ref_kind, why = TORCH_BACKEND_DIFFERENCES.get(n, ("torch-libuv", None))
        ref = all_results[ref_kind].get(n, "<missing>")
        if why is None and libuv != classic:
            failures.append(
                "%s: torch-libuv and torch-classic differ (not a known difference)\n"
                "    torch-libuv:   %s\n    torch-classic: %s"
                % (n, json.dumps(libuv, sort_keys=True), json.dumps(classic, sort_keys=True))
            )
        marks = []
        for kind in MESHRUN_SERVERS:
            mesh = all_results[kind].get(n, "<missing>")
            if mesh != ref:
                failures.append(
                    "%s: %s differs from %s\n    expected: %s\n    got:      %s"
                    % (
                        n,
                        kind,
                        ref_kind,
                        json.dumps(ref, sort_keys=True),
                        json.dumps(mesh, sort_keys=True),
                    )
                )
            marks.append("=" if mesh == ref else "DIFF")
        rows.append(
            (
                n,
                "ref" if ref_kind == "torch-libuv" else ("=" if libuv == ref else "DIFF*"),
                "ref" if ref_kind == "torch-classic" else ("=" if classic == ref else "DIFF*"),
                marks,
                ref,
            )
        )
    print(
        "\n%-32s %-12s %-13s %-8s %-14s %s"
        % ("case", "torch-libuv", "torch-classic", "meshrun", "meshrun-agent", "reference outcome")
    )
    for n, a, b, marks, ref in rows:
        print("%-32s %-12s %-13s %-8s %-14s %s" % (n, a, b, marks[0], marks[1], short(ref)))
    print(
        "(ref: the reference for meshrun; =: same outcome; DIFF*: a known torch backend "
        "difference; DIFF: a failure)"
    )
    for n, (kind, why) in TORCH_BACKEND_DIFFERENCES.items():
        if n in names:
            print("  %s: meshrun must match %s: %s" % (n, kind, why))
            for k in SERVERS:
                print("      %-14s %s" % (k, json.dumps(all_results[k].get(n), sort_keys=True)))
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", choices=SERVERS + ["all"], required=True)
    ap.add_argument("--client", choices=["python", "cpp"], default="python")
    ap.add_argument("--rdzvd", help="meshrun-rdzvd binary (for --server meshrun or all)")
    ap.add_argument(
        "--rdzvd-threads",
        type=int,
        default=0,
        help="meshrun-rdzvd's --tcpstore-threads (0: its default); its"
        " cases' clients are then dealt over that many event loops",
    )
    ap.add_argument("--relay", help="store_relay_tool binary (for --server meshrun-agent or all)")
    ap.add_argument("--cpp-client", help="tcpstore_client_conformance binary (--client cpp)")
    ap.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    ap.add_argument("--json", help="write the outcomes here")
    args = ap.parse_args()
    if args.client == "cpp" and not args.cpp_client:
        ap.error("--client cpp needs --cpp-client")
    if args.client == "python":
        import torch.distributed  # noqa: F401 - once, before any case is timed
    if args.server == "all":
        all_results = run_all_in_parallel(args)
    else:
        all_results = {args.server: run_server(args.server, args)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1, sort_keys=True)
    if args.server != "all":
        for n, outcome in all_results[args.server].items():
            print("%-32s %s" % (n, json.dumps(outcome, sort_keys=True)))
        return 0
    failures = compare(all_results)
    if failures:
        print("\n%d difference(s):" % len(failures))
        for f in failures:
            print("- " + f)
        return 1
    print("\nall servers conform")
    return 0


if __name__ == "__main__":
    sys.exit(main())

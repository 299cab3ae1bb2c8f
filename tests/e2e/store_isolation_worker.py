"""A worker of one of several runs on one daemon (StoreIsolationTest), checking
through a stock torch TCPStore client at MASTER_ADDR:MASTER_PORT that it sees
its own run's keys and none of the others'.

    store_isolation_worker.py OUT_DIR RUN RUNS KEYS

RUN: this run's name; RUNS: every run's, comma-separated; KEYS: how many
keys each rank of this run sets (the runs set different numbers, so a count
that included another run's keys would differ).

The test steps every worker of every run through three phases, by files in
OUT_DIR: each worker writes <phase>.<RUN>.<rank> when it is done with one,
then waits (bounded) for go.<phase> from the test before the next:
  ready:   torch's process group is up (all of its own keys written);
  counted: num_keys() read before this run's keys;
  set:     this rank set iso/<RUN>/<rank>/<k> = "<RUN>:<rank>:<k>".
Then it checks and writes result.<RUN>.<rank>: KEY=VALUE lines, "result=ok"
or "result=" and what failed, plus the MASTER_PORT and MESHRUN_STORE_PREFIX
it had. Exit 0 when ok, 1 when not.
"""

import datetime
import os
import sys

import torch.distributed as dist
from handshake_files import DEADLINE_S, await_file, write_file

SHORT = datetime.timedelta(milliseconds=300)


def fails(call):
    """Whether `call` raised (the short timeout of a key that never comes)."""
    try:
        call()
    except Exception:  # torch raises DistStoreError (a RuntimeError) on timeout
        return True
    return False


def main():
    out_dir, run, runs, keys = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=DEADLINE_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=DEADLINE_S),
    )

    def phase(name):
        write_file(os.path.join(out_dir, f"{name}.{run}.{rank}"), "")
        await_file(os.path.join(out_dir, f"go.{name}"))

    phase("ready")
    before = store.num_keys()
    phase("counted")
    for k in range(keys):
        store.set(f"iso/{run}/{rank}/{k}", f"{run}:{rank}:{k}")
    phase("set")

    problems = []
    for r in range(world):
        for k in range(keys):
            key = f"iso/{run}/{r}/{k}"
            value = store.get(key).decode()
            if value != f"{run}:{r}:{k}":
                problems.append(f"{key}={value}")
    added = store.num_keys() - before
    if added != world * keys:
        problems.append(f"num_keys grew by {added}, not {world * keys}")
    store.set_timeout(SHORT)
    for other in runs:
        if other == run:
            continue
        theirs = [f"iso/{other}/{r}/0" for r in range(world)]
        if store.check(theirs):
            problems.append(f"check({theirs}) is true")
        if not fails(lambda theirs=theirs: store.get(theirs[0])):
            problems.append(f"get({theirs[0]}) answered")
        if not fails(lambda theirs=theirs: store.wait(theirs, SHORT)):
            problems.append(f"wait({theirs}) returned")
    write_file(
        os.path.join(out_dir, f"result.{run}.{rank}"),
        f"result={'ok' if not problems else '; '.join(problems)}\n"
        f"MASTER_PORT={os.environ['MASTER_PORT']}\n"
        f"MESHRUN_STORE_PREFIX={os.environ['MESHRUN_STORE_PREFIX']}\n",
    )
    dist.destroy_process_group()
    return 0 if not problems else 1


if __name__ == "__main__":
    code = main()
    # No interpreter finalization: torch 2.15's Gloo threads may still drop a
    # finished work's tensors then (see agent_store_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

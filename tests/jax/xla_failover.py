"""Unmodified jaxlib clients through coord-proxy sidecars while the test kills coordinator
leaders under them. Prints one JSON line per operation and one per process exit.

Usage: xla_failover.py ADDRESS_OF_TASK_0 ADDRESS_OF_TASK_1 ...

Task i talks to the i-th address (its host's sidecar). The test drives the failovers through the
key-value store:
- phase 1: tasks 1.. wait at barrier "fb1" (each first writes arrived1/<i>); task 0 blocks on
  key go/1. The test kills the leader while they wait, then writes go/1, and task 0 joins.
- phase 2: the same with barrier "fb2", keys arrived2/<i> and go/2.
Then every task increments a counter, asks which tasks are alive, and shuts down.
"""

import sys

from procs import run_tasks

WAIT_MS = 180_000


def run(addresses, task, out):
    from jax._src.lib import _jax

    n = len(addresses)
    log = []

    def record(op, fn):
        try:
            r = fn()
            if isinstance(r, bytes):
                r = r.decode()
            log.append({"task": task, "op": op, "ok": r})
        except Exception as e:  # noqa: BLE001 - every error is recorded
            log.append({"task": task, "op": op, "err": str(e)[:300]})

    client = _jax.get_distributed_runtime_client(
        addresses[task],
        task,
        init_timeout=120,
        heartbeat_timeout=20,
        shutdown_timeout=120,
        shutdown_on_destruction=False,
    )
    record("connect", client.connect)
    for phase in (1, 2):
        if task == 0:
            record(f"get_go{phase}", lambda: client.blocking_key_value_get(f"go/{phase}", WAIT_MS))
        else:
            record(f"arrive{phase}", lambda: client.key_value_set(f"arrived{phase}/{task}", "1"))
        record(f"barrier{phase}", lambda: client.wait_at_barrier(f"fb{phase}", WAIT_MS))
    record("increment", lambda: int(client.key_value_increment("ctr", 1)))
    record("barrier_after", lambda: client.wait_at_barrier("after", WAIT_MS))
    record("counter", lambda: client.key_value_try_get("ctr"))
    record("live_nodes", lambda: sorted(client.get_live_nodes(list(range(n)))))
    record("shutdown", client.shutdown)
    out.put(log)


def main():
    addresses = sys.argv[1:]
    run_tasks(run, (addresses,), len(addresses))


if __name__ == "__main__":
    main()

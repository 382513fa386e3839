"""Drives N jaxlib distributed-runtime clients against a coordination service and prints, per
process, one JSON line per operation: its result, or the gRPC status code of its error.

Usage: xla_conformance.py ADDRESS NUM_PROCESSES [--own-service] [--die TASK]

--die TASK: that task vanishes (stops heartbeating) after a barrier; the others then ask which
tasks are alive. The service must treat the job as recoverable (see below).

With --own-service, jaxlib's own service (get_distributed_runtime_service) is started at ADDRESS
first, so the same script measures the reference. The output of both runs can be compared line by
line: same results, same error codes.
"""

import os
import sys

from procs import run_tasks

HEARTBEAT_TIMEOUT_S = 3


def code_of(err):
    # jaxlib raises XlaRuntimeError("CODE: message").
    text = str(err)
    head = text.split(":", 1)[0].strip()
    return head if head.isupper() else "UNKNOWN"


def run(address, n, die, task, out):
    from jax._src.lib import _jax

    log = []

    def record(op, fn):
        try:
            r = fn()
            if isinstance(r, bytes):
                r = r.decode()
            log.append({"task": task, "op": op, "ok": r})
        except Exception as e:  # noqa: BLE001 - every error is recorded by its code
            log.append({"task": task, "op": op, "err": code_of(e)})

    client = _jax.get_distributed_runtime_client(
        address,
        task,
        init_timeout=180,
        heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        shutdown_timeout=60,
        shutdown_on_destruction=False,
        use_compression=(task % 2 == 1),
    )
    record("connect", client.connect)
    record("set", lambda: client.key_value_set(f"k/{task}", f"v{task}"))
    record("set_again", lambda: client.key_value_set(f"k/{task}", "x"))
    record("overwrite", lambda: client.key_value_set(f"k/{task}", f"v{task}", allow_overwrite=True))
    record("blocking_get_peer", lambda: client.blocking_key_value_get(f"k/{(task + 1) % n}", 30000))
    record("try_get_missing", lambda: client.key_value_try_get("missing"))
    record("blocking_get_timeout", lambda: client.blocking_key_value_get("never", 200))
    record("increment", lambda: client.key_value_increment("ctr", 1) > 0)
    record("barrier_1", lambda: client.wait_at_barrier("b", 30000))
    record("dir_get", lambda: sorted(client.key_value_dir_get("k")))
    record("counter_after_barrier", lambda: client.key_value_try_get("ctr"))
    record("barrier_reused", lambda: client.wait_at_barrier("b", 30000))
    record("barrier_subset", lambda: client.wait_at_barrier("pair", 30000, [0, 1]) if task in (0, 1) else None)
    record("barrier_not_member", lambda: client.wait_at_barrier("solo", 1000, [0]) if task == 1 else None)
    record("live_nodes", lambda: sorted(client.get_live_nodes(list(range(n)))))
    record("delete_own", lambda: client.key_value_delete(f"k/{task}"))
    record("barrier_2", lambda: client.wait_at_barrier("b2", 30000))
    record("try_get_deleted", lambda: client.key_value_try_get(f"k/{task}"))
    record("dir_after_delete", lambda: client.key_value_dir_get("k"))
    if die is not None:
        record("barrier_before_death", lambda: client.wait_at_barrier("b3", 30000))
        if task == die:
            # Stop heartbeating: vanish without a word (after the log is handed over: the
            # queue's feeder thread must finish before _exit).
            out.put(log)
            out.close()
            out.join_thread()
            os._exit(0)
        # Returns once the dead task is known dead (its heartbeats stopped) and every live one
        # asked: the dead task is not in the answer.
        record("live_after_death", lambda: sorted(client.get_live_nodes(list(range(n)))))
    else:
        record("shutdown", client.shutdown)
    out.put(log)


def main():
    address, n = sys.argv[1], int(sys.argv[2])
    die = int(sys.argv[sys.argv.index("--die") + 1]) if "--die" in sys.argv else None
    service = None
    if "--own-service" in sys.argv:
        from jax._src.lib import _jax

        # With a task that dies, its job is recoverable: otherwise the service propagates its
        # death as an error, and jaxlib's client kills every other process (its error callback
        # cannot be replaced from Python in 0.10: it fails with std::bad_cast).
        service = _jax.get_distributed_runtime_service(
            address,
            n,
            heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
            shutdown_timeout=60,
            recoverable=die is not None,
        )
    exits = run_tasks(run, (address, n, die), n, timeout=180, exit_lines=False)
    if service is not None:
        service.shutdown()
    if any(code != 0 for code in exits):
        sys.exit(f"task exit codes: {exits}")


if __name__ == "__main__":
    main()

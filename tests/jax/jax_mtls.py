"""jaxlib's own mTLS (jaxlib 0.11.2 and later) straight to a replica of a TLS ensemble, with no
sidecar. Prints one JSON line per operation (its result, or the gRPC code and message of its
error) and one per process exit.

Usage:
  jax_mtls.py job ADDRESS CA PREFIX CERT:KEY [CERT:KEY ...]
      One process per CERT:KEY pair (process i presents pair i): `jax.distributed.initialize`
      with mtls_* arguments and verify_secure_credentials, then key-value calls and barriers.
      After the first barrier each process writes ready/<i> and waits for key `go` (the test
      tries its impersonations in between), then gets a peer's key, increments a counter, meets
      at a second barrier, asks who is alive and shuts down.
  jax_mtls.py as ADDRESS CA PREFIX TASK CERT:KEY
      One client presenting CERT:KEY connects as task TASK (init_timeout 90 s).
  jax_mtls.py plain ADDRESS TASK
      One client without credentials connects as task TASK (init_timeout 10 s).
  Where jaxlib aborts the client's process (as it does when registration fails), a last line
  gives the status it logged as the connect's error.

PREFIX is mtls_peer_uri_prefix: the replicas' certificates must carry a URI SAN starting with it
(jaxlib then checks that in place of the host name).
"""

import json
import sys

from procs import run_tasks

WAIT_MS = 300_000


def code_of(err):
    # jaxlib raises XlaRuntimeError("CODE: message").
    text = str(err)
    head = text.split(":", 1)[0].strip()
    return head if head.isupper() else "UNKNOWN"


def recorder(task, log):
    def record(op, fn):
        try:
            r = fn()
            if isinstance(r, bytes):
                r = r.decode()
            log.append({"task": task, "op": op, "ok": r})
        except Exception as e:  # noqa: BLE001 - every error is recorded by its code
            log.append({"task": task, "op": op, "err": code_of(e), "message": str(e)[:400]})

    return record


def mtls(ca, prefix, pair):
    cert, key = pair.split(":")
    return dict(
        mtls_cert_file=cert,
        mtls_key_file=key,
        mtls_ca_file=ca,
        mtls_peer_uri_prefix=prefix,
        verify_secure_credentials=True,
    )


def job(address, ca, prefix, pairs, pid, out):
    import os

    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from jax._src import distributed

    n = len(pairs)
    log = []
    record = recorder(pid, log)
    # Process 0 also starts jaxlib's own service (with the same credentials): on a throwaway
    # port, unused.
    record(
        "initialize",
        lambda: jax.distributed.initialize(
            coordinator_address=address,
            num_processes=n,
            process_id=pid,
            coordinator_bind_address="127.0.0.1:0",
            initialization_timeout=120,
            **mtls(ca, prefix, pairs[pid]),
        ),
    )
    if "err" in log[-1]:
        out.put(log)
        return
    client = distributed.global_state.client
    record("process_count", jax.process_count)
    record("set", lambda: client.key_value_set(f"k/{pid}", f"v{pid}"))
    record("barrier", lambda: client.wait_at_barrier("ready", WAIT_MS))
    record("ready", lambda: client.key_value_set(f"ready/{pid}", "1"))
    record("get_go", lambda: client.blocking_key_value_get("go", WAIT_MS))
    record("get_peer", lambda: client.blocking_key_value_get(f"k/{(pid + 1) % n}", WAIT_MS))
    record("increment", lambda: int(client.key_value_increment("ctr", 1)))
    record("barrier_after", lambda: client.wait_at_barrier("after", WAIT_MS))
    record("counter", lambda: client.key_value_try_get("ctr"))
    record("live_nodes", lambda: sorted(client.get_live_nodes(list(range(n)))))
    record("shutdown", jax.distributed.shutdown)
    out.put(log)


def one_client(address, task, credentials, init_timeout, stderr_path, _pid, out):
    import os

    from jax._src.lib import _jax

    # jaxlib aborts the process when registration fails (its error callback cannot be replaced
    # from Python: std::bad_cast), after logging the status: keep the log for the parent.
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    log = []
    record = recorder(task, log)
    client = _jax.get_distributed_runtime_client(
        address,
        task,
        init_timeout=init_timeout,
        shutdown_on_destruction=False,
        **credentials,
    )
    record("connect", client.connect)
    out.put(log)


def connect(address, task, credentials, init_timeout):
    """Runs one client in a process of its own and prints what its connect came to: an entry of
    its own, or the status jaxlib logged before it aborted the process."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/stderr"
        args = (address, task, credentials, init_timeout, path)
        exits = run_tasks(one_client, args, 1, timeout=180)
        with open(path, errors="replace") as f:
            stderr = f.read()
    if exits[0] != 0:
        status = re.search(r"absl::Status: ([A-Z_]+): (.*)", stderr)
        entry = {"task": task, "op": "connect", "aborted": exits[0], "stderr": stderr[-2000:]}
        if status:
            entry.update(err=status.group(1), message=status.group(2)[:400])
        print(json.dumps(entry, sort_keys=True))


def main():
    mode, address = sys.argv[1], sys.argv[2]
    if mode == "job":
        ca, prefix, pairs = sys.argv[3], sys.argv[4], sys.argv[5:]
        run_tasks(job, (address, ca, prefix, pairs), len(pairs), timeout=600)
    elif mode == "as":
        ca, prefix, task, pair = sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
        # A refusal must come at once, not after jaxlib retried until this timeout.
        connect(address, task, mtls(ca, prefix, pair), init_timeout=90)
    elif mode == "plain":
        connect(address, int(sys.argv[3]), {}, init_timeout=10)
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

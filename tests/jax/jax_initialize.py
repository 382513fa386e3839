"""`jax.distributed.initialize` against a coord ensemble through the host's coord-proxy, as the
README shows it. Prints one JSON line per process: what JAX sees of the job.

Usage: jax_initialize.py SIDECAR_ADDRESS[,SIDECAR_ADDRESS...] NUM_PROCESSES

With one address per process (comma separated), process i uses the i-th: a sidecar of its own,
which may present the process's own certificate to an ensemble that asks for one.
"""

import sys

from procs import run_tasks


def run(addresses, n, pid, out):
    import os

    address = addresses[pid] if len(addresses) > 1 else addresses[0]

    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    # Process 0 would start jaxlib's own service at coordinator_address; bind that one to a
    # throwaway port, and every process (0 included) connects to the sidecar instead.
    try:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=n,
            process_id=pid,
            coordinator_bind_address="127.0.0.1:0",
            initialization_timeout=120,
        )
    except Exception as e:  # noqa: BLE001 - a refused start is reported, not hidden
        out.put({"task": pid, "error": str(e)[:500]})
        return
    seen = {
        "task": pid,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "global_devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
        "device_processes": sorted({d.process_index for d in jax.devices()}),
    }
    jax.distributed.shutdown()
    out.put(seen)


def main():
    addresses, n = sys.argv[1].split(","), int(sys.argv[2])
    run_tasks(run, (addresses, n), n, timeout=300)


if __name__ == "__main__":
    main()

"""Runs one Python process per JAX task and prints what each reported, for the test scripts.

Each task process calls `target(*args, task, out)` and puts one list of JSON-able entries on
`out` (or a dict, for one entry). The entries are printed sorted by task, one JSON line each,
then one line per process with its exit code: a process that jaxlib killed shows here, with no
entries of its own.
"""

import json
import multiprocessing as mp
import sys


def run_tasks(target, args, n, timeout=600, exit_lines=True):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, t, out)) for t in range(n)]
    for p in procs:
        p.start()
    reports = []
    for _ in procs:
        try:
            reports.append(out.get(timeout=timeout))
        except Exception:  # noqa: BLE001 - a process that died sends nothing
            break
    for p in procs:
        p.join(timeout=60)
    entries = []
    for r in reports:
        entries.extend(r if isinstance(r, list) else [r])
    for e in sorted(entries, key=lambda e: e["task"]):
        print(json.dumps(e, sort_keys=True))
    if exit_lines:
        for t, p in enumerate(procs):
            print(json.dumps({"task": t, "exit": p.exitcode}))
    sys.stdout.flush()
    return [p.exitcode for p in procs]

"""Runs one Python process per JAX task and prints what each reported, for the test scripts.

Each task process calls `target(*args, task, out)` and puts one list of JSON-able entries on
`out` (or a dict, for one entry). The entries are printed sorted by task, one JSON line each,
then one line per process with its exit code: a process that jaxlib killed shows here, with no
entries of its own.
"""

import json
import multiprocessing as mp
import queue
import sys
import time


def run_tasks(target, args, n, timeout=600, exit_lines=True):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, t, out)) for t in range(n)]
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + timeout
    while len(reports) < n and time.monotonic() < deadline:
        try:
            reports.append(out.get(timeout=1))
        except queue.Empty:
            # A process that died (jaxlib ends a process on a fatal error) sends nothing: once
            # none is left, what they sent has arrived.
            if not any(p.is_alive() for p in procs):
                try:
                    while len(reports) < n:
                        reports.append(out.get(timeout=1))
                except queue.Empty:
                    pass
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

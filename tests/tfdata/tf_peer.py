#!/usr/bin/env python3
"""TensorFlow's own tf.data service, run as the peer that coord-bench compares its dispatcher with.

Subcommands (each prints exactly one JSON object, on the last line of stdout; progress and TF's
logs go to stderr):

  splits --workers W --splits N [--clients C] [--worker-procs P] [--batch B]
      Dynamic sharding ("distributed_epoch") of tf.data.Dataset.range(N) over W workers: one split
      per element, every split handed out by the dispatcher (GetSplit) and journaled with fsync
      before it is handed out (fault_tolerant_mode=True). Times the timed run from the arrival of
      the first element at the client(s) to the arrival of the last one, after a small warm-up run
      on the same servers (so TF's start-up, graph building and connection set-up are not counted),
      and checks that the elements read are exactly 0..N-1, each once.
      -> {"workers","splits","seconds","splits_per_sec","elements","tf_version",...}

  restore --updates N [--workers W]
      Makes a dispatcher journal of about N updates (reads a distributed_epoch range(N): each split
      is one ProduceSplit update), kills the dispatcher (SIGKILL: a crash, the case the journal is
      for), then times a NEW DispatchServer on the same work_dir until it is restored and serving.
      -> {"updates_approx","updates_exact","journal_bytes","journal_files","restore_seconds",
          "answered_seconds",...}

Process layout (the same for both): the dispatcher runs in a process of its own, the W workers in
P other processes (default 1; they are spread evenly), and the client(s) in this process. Not all
in one process, because (a) a client in the same process as a worker reads from it through TF's
in-process shortcut (target_workers="AUTO" picks local workers and skips gRPC), which a real job
never does, and (b) killing the dispatcher's process is the honest "dispatcher restarts" event,
where stopping an in-process DispatchServer is not (TF's servers do not shut down cleanly: #56490).
All children exit when their stdin closes, so they die with this process whichever way it ends.

"Restored and serving", the end point of restore_seconds: DispatchServer(config) (start=True) has
returned. In TF that means the gRPC server is up (it listens from before the replay, but refuses
every RPC with "Dispatcher has not started yet" until the end), the whole journal has been read and
applied, every split provider has been fast-forwarded to where it was, a new journal file has been
opened and the dispatcher marked started: from that instant on, RPCs are answered. The script then
confirms it with a real client RPC (register_dataset: GetOrRegisterDataset over gRPC) and checks
that the restored state has the workers the journal registered; answered_seconds is construction
until that RPC returned, so it adds the client's cost (gRPC channel, graph serialization, a dataset
file written and one journal fsync), which does not grow with the journal. The restoring process
has already imported TF: the import (seconds, the same for any journal) is counted in neither.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

JOURNAL_DIR = "tf_data_dispatcher_journal"
READY_TIMEOUT_S = 300.0


def log(msg):
    print(f"tf_peer: {msg}", file=sys.stderr, flush=True)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class PeerError(Exception):
    pass


def fail(msg):
    raise PeerError(msg)


def import_tf():
    import tensorflow as tf  # noqa: PLC0415

    return tf


# ---------------------------------------------------------------------------------------------
# Child roles: a dispatcher process and a worker-host process. Each prints one "READY ..." line on
# stdout once serving, then waits for its stdin to close and exits at once (os._exit: TF's servers
# do not stop cleanly).


def role_dispatcher(args):
    tf = import_tf()
    svc = tf.data.experimental.service
    server = svc.DispatchServer(
        svc.DispatcherConfig(port=0, work_dir=args.work_dir, fault_tolerant_mode=True)
    )
    port = server.target.rsplit(":", 1)[1]
    print(f"READY {port}", flush=True)
    sys.stdin.read()
    os._exit(0)


def role_workers(args):
    tf = import_tf()
    svc = tf.data.experimental.service
    workers = []
    for _ in range(args.count):
        # start=True: returns once the worker's first heartbeat has registered it.
        workers.append(svc.WorkerServer(svc.WorkerConfig(dispatcher_address=args.dispatcher)))
    print("READY " + " ".join(w._address for w in workers), flush=True)
    sys.stdin.read()
    os._exit(0)


class Children:
    """The child processes of this run; all killed by kill_all() (and with this process)."""

    def __init__(self):
        self.procs = []

    def spawn(self, role_args):
        cmd = [sys.executable, os.path.abspath(__file__)] + role_args
        p = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True
        )
        self.procs.append(p)
        return p

    @staticmethod
    def wait_ready(p, what):
        q = queue.Queue()
        threading.Thread(target=lambda: q.put(p.stdout.readline()), daemon=True).start()
        try:
            line = q.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            fail(f"{what} not ready after {READY_TIMEOUT_S:.0f}s")
        if not line.startswith("READY"):
            fail(f"{what} exited before it was ready (exit code {p.poll()})")
        return line.split()[1:]

    def kill(self, p):
        try:
            p.kill()
        except OSError:
            pass
        p.wait()

    def kill_all(self):
        for p in self.procs:
            self.kill(p)
        self.procs = []


def start_service(children, work_dir, workers, worker_procs):
    """Dispatcher + workers; returns (dispatcher process, "localhost:port")."""
    d = children.spawn(["_dispatcher", "--work-dir", work_dir])
    (port,) = Children.wait_ready(d, "dispatcher")
    addr = f"localhost:{port}"
    procs = max(1, min(worker_procs, workers))
    counts = [workers // procs + (1 if i < workers % procs else 0) for i in range(procs)]
    hosts = [children.spawn(["_workers", "--dispatcher", addr, "--count", str(c)]) for c in counts]
    for i, h in enumerate(hosts):
        Children.wait_ready(h, f"worker host {i}")
    return d, addr


# ---------------------------------------------------------------------------------------------
# Reading a distributed_epoch range dataset.


def read_range(tf, target, n, clients, batch, job_name, exact_take):
    """Reads range(n) with dynamic sharding through `clients` consumers of one job.

    Returns (values as a sorted numpy array, first element arrival, last element arrival, start).
    With one client and exact_take, the client stops after n elements (take(n)) so the time of the
    last element does not include waiting for end-of-sequence; otherwise each client reads to its
    end of sequence (the last, partial batch then arrives with it).
    """
    import numpy as np  # noqa: PLC0415

    svc = tf.data.experimental.service
    results = [None] * clients
    errors = []

    def one(i):
        try:
            ds = tf.data.Dataset.range(n).apply(
                svc.distribute(
                    processing_mode="distributed_epoch",
                    service=target,
                    job_name=job_name if clients > 1 else None,
                )
            )
            if clients == 1 and exact_take:
                ds = ds.take(n)
            ds = ds.batch(batch)
            chunks = []
            first = last = None
            for b in ds:
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
                chunks.append(b.numpy())
            results[i] = (chunks, first, last)
        except Exception as e:  # noqa: BLE001
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        fail("; ".join(errors))
    chunks = [c for r in results for c in r[0]]
    firsts = [r[1] for r in results if r[1] is not None]
    lasts = [r[2] for r in results if r[2] is not None]
    if not firsts:
        fail("no element was read")
    values = np.sort(np.concatenate(chunks)) if chunks else np.zeros(0, dtype=np.int64)
    return values, min(firsts), max(lasts), start, len(chunks[0]) if clients == 1 else None


def check_exact(values, n):
    import numpy as np  # noqa: PLC0415

    if len(values) != n or not np.array_equal(values, np.arange(n, dtype=values.dtype)):
        uniq = len(np.unique(values))
        fail(
            f"elements read are not exactly 0..{n - 1}: {len(values)} elements, {uniq} distinct, "
            f"min {values.min() if len(values) else None}, "
            f"max {values.max() if len(values) else None}"
        )


def cmd_splits(args):
    if args.workers < 1 or args.splits < 1 or args.clients < 1:
        fail("--workers, --splits and --clients must be positive")
    children = Children()
    work = tempfile.mkdtemp(prefix="tf_peer_splits_")
    try:
        t = time.perf_counter()
        _, addr = start_service(children, work, args.workers, args.worker_procs)
        tf = import_tf()
        target = f"grpc://{addr}"
        log(f"dispatcher {addr} and {args.workers} workers up in {time.perf_counter() - t:.1f}s")
        warm = min(args.splits, args.warmup)
        t = time.perf_counter()
        values, *_ = read_range(tf, target, warm, args.clients, args.batch, "warmup", True)
        check_exact(values, warm)
        log(f"warm-up of {warm} splits in {time.perf_counter() - t:.1f}s")
        values, first, last, start, first_batch = read_range(
            tf, target, args.splits, args.clients, args.batch, "timed", True
        )
        check_exact(values, args.splits)
        seconds = last - first
        # Elements that arrived after the clock started: all but the first batch (one client) or,
        # with several clients, all (their first batches overlap the clock's start).
        counted = args.splits - first_batch if first_batch is not None else args.splits
        rate = counted / seconds if seconds > 0 else float("inf")
        result = {
            "workers": args.workers,
            "splits": args.splits,
            "seconds": seconds,
            "splits_per_sec": rate,
            "elements": int(len(values)),
            "tf_version": tf.__version__,
            "clients": args.clients,
            "worker_procs": max(1, min(args.worker_procs, args.workers)),
            "client_batch": args.batch,
            "seconds_incl_job_start": last - start,
            "journal_bytes": dir_bytes(os.path.join(work, JOURNAL_DIR))[0],
        }
    finally:
        children.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    emit(result)
    os._exit(0)


def dir_bytes(path):
    total = files = 0
    if os.path.isdir(path):
        for name in os.listdir(path):
            p = os.path.join(path, name)
            if os.path.isfile(p):
                total += os.path.getsize(p)
                files += 1
    return total, files


def count_records(paths):
    """Records in files of TFRecord framing (the journal's): u64 length, u32 CRC, data, u32 CRC.

    A torn last record (a crash mid-write) is not counted."""
    n = 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        off = 0
        while off + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, off)
            off += 12 + length + 4
            if off > len(data):
                break
            n += 1
    return n


def cmd_restore(args):
    if args.updates < 1:
        fail("--updates must be positive")
    children = Children()
    work = tempfile.mkdtemp(prefix="tf_peer_restore_", dir=args.work_parent)
    try:
        d, addr = start_service(children, work, args.workers, 1)
        tf = import_tf()
        svc = tf.data.experimental.service
        log(f"making a journal of ~{args.updates} updates (one ProduceSplit per element)")
        t = time.perf_counter()
        values, *_ = read_range(tf, f"grpc://{addr}", args.updates, 1, 1024, None, False)
        check_exact(values, args.updates)
        produce_s = time.perf_counter() - t
        del values
        log(f"journal made in {produce_s:.1f}s ({args.updates / produce_s:.0f} splits/s)")
        # The dispatcher crashes; the workers go too (they would only retry their heartbeats).
        children.kill_all()
        jdir = os.path.join(work, JOURNAL_DIR)
        journal_files = sorted(os.path.join(jdir, f) for f in os.listdir(jdir))
        journal_bytes, nfiles = dir_bytes(jdir)

        cfg = svc.DispatcherConfig(port=0, work_dir=work, fault_tolerant_mode=True)
        t0 = time.perf_counter()
        server = svc.DispatchServer(cfg)  # start=True: replays the journal, then serves
        t1 = time.perf_counter()
        svc.register_dataset(server.target, tf.data.Dataset.range(1))
        t2 = time.perf_counter()
        restored_workers = server._num_workers()
        log(f"restored: start() {t1 - t0:.3f}s, first RPC answered after {t2 - t1:.3f}s more")
        if restored_workers != args.workers:
            fail(f"the restored dispatcher knows {restored_workers} workers, not {args.workers}")

        # Exact count of the journal's records, after the clock stopped.
        exact = count_records(journal_files)
        result = {
            "updates_approx": args.updates,
            "updates_exact": exact,
            "journal_bytes": journal_bytes,
            "journal_files": nfiles,
            "restore_seconds": t1 - t0,
            "answered_seconds": t2 - t0,
            "restored_workers": restored_workers,
            "produce_seconds": produce_s,
            "tf_version": tf.__version__,
        }
    finally:
        children.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    emit(result)
    os._exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("splits")
    s.add_argument("--workers", type=int, required=True)
    s.add_argument("--splits", type=int, required=True)
    s.add_argument("--clients", type=int, default=1)
    s.add_argument("--worker-procs", type=int, default=1)
    s.add_argument("--batch", type=int, default=256, help="client-side batch (after distribute)")
    s.add_argument("--warmup", type=int, default=2000, help="splits in the untimed first run")
    r = sub.add_parser("restore")
    r.add_argument("--updates", type=int, required=True)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--work-parent", default=None, help="where the work_dir goes (default: $TMPDIR)")
    d = sub.add_parser("_dispatcher")
    d.add_argument("--work-dir", required=True)
    w = sub.add_parser("_workers")
    w.add_argument("--dispatcher", required=True)
    w.add_argument("--count", type=int, required=True)
    args = p.parse_args()
    {
        "splits": cmd_splits,
        "restore": cmd_restore,
        "_dispatcher": role_dispatcher,
        "_workers": role_workers,
    }[args.cmd](args)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        msg = str(e) if isinstance(e, PeerError) else f"{type(e).__name__}: {e}"
        log(f"error: {msg}")
        emit({"error": msg})
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: TF's servers and threads can hang the interpreter's exit

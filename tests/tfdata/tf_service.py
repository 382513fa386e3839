#!/usr/bin/env python3
"""Real TensorFlow tf.data service processes, pointed at ANY dispatcher address.

The tests of coord's `tensorflow.data.DispatcherService` run the same scenarios against TF's own
dispatcher and against a coord ensemble; this script is the TensorFlow side of both: TF's
`DispatchServer`, TF's `WorkerServer`, and TF clients (`distribute()`), each its own process.

Every process prints JSON event lines on stdout (each with "event" and "wall", the time.time() it
was printed) and exits at once when its stdin closes, so nothing outlives the test that started
it. TF's logs go to stderr.

Subcommands:

  dispatcher [--worker-addresses a,b,...] [--port P] [--work-dir D]
      TF's own DispatchServer, fault_tolerant_mode=True (its journal in D, a temp dir by default).
      -> {"event":"ready","address":"localhost:P"}

  worker --dispatcher ADDR [--port P] [--heartbeat-ms MS]
      One WorkerServer. -> {"event":"ready","address": the worker_address it registers with}

  make-files --dir D --files F --records R
      F TFRecord files D/part-00000 ... whose records are 8-byte little-endian int64s: record r of
      file f holds f*R+r (written without TF: the TFRecord framing is done here).
      -> {"event":"files","paths":[...],"records":R}

  read [--dispatcher ADDR] (--spec JSON | --specs JSON-LIST | flags)
      One reader per spec, each a thread of this process (several readers share one TF import):
      builds the dataset, applies distribute() and reads it with as_numpy_iterator. Without
      --dispatcher it imports TF, prints {"event":"imported"} and waits for a line "go ADDR" on
      stdin (so the import overlaps the servers' start-up). Then, per reader:
      {"event":"progress","reader":i,"read":k}         every progress_every elements
      {"event":"rewind","reader":i,"index":k,"value":v,"highest":h}  the first element smaller
          than one read before (with report_rewind): on an increasing dataset, a stream that began
          again, e.g. the first element of a worker added mid-job
      {"event":"done","reader":i,"elements":[...],"seconds":s,"first_seconds":f[,"walls":[...]]}
      {"event":"error","reader":i,"code":"INVALID_ARGUMENT","message":"...","read":k}
      "seconds" runs from the reader's start (before distribute(); readers build one at a time)
      to its end, "first_seconds" to its first element. A line "stop I" on stdin ends reader I where it is (its "done" has
      "stopped": true). The process exits when every reader is done (code 1 if one failed) or when
      stdin closes.
      A spec (flags of the same names for a single reader):
        dataset: "range:N" | "slices:N" | "files:DIR"   (each also through map/batch/unbatch)
        mode: off|parallel_epochs|dynamic|distributed_epoch|file|data|file_or_data|hint
        job_name, num_consumers, consumer_index, repeat (-1: forever), limit (elements to read),
        shard_hint (put shard(SHARD_HINT, SHARD_HINT) after the source), progress_every,
        timestamps (add "walls", each element's arrival time)

  bad-input --dispatcher ADDR --cases a,b,...
      Calls TF makes with bad input; per case {"event":"case","case":name,"results":[...]}, each
      result {"ok":true,"elements":[...]} or {"ok":false,"code":...,"message":...} or
      {"ok":false,"code":"HUNG"} if it did not return within --case-timeout seconds. Cases:
        unknown-dataset-id    from_dataset_id with a dataset id nobody registered
        job-mode-mismatch     two distribute() with one job_name, OFF then DYNAMIC
        consumers-mismatch    one job_name, num_consumers 2 (index 0) then 3 (index 1), on an
                              infinite dataset; 4 elements each
        round-robin-finite    num_consumers=2 on a finite dataset
        static-unconfigured   FILE_OR_DATA sharding (for a dispatcher without worker_addresses)
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

# gRPC / absl status codes by number, as TF's errors carry them.
CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

_emit_lock = threading.Lock()

# A crash inside TF (a signal) prints every thread's Python stack on stderr, which the tests show.
faulthandler.enable(all_threads=True)

# Readers build their datasets and iterators one at a time, then read at once: a reader process
# of TF 2.21 once died of SIGSEGV against TF's own dispatcher and workers before any of its 27
# readers finished, all having begun building at once. Building is a small part of a read.
_build_lock = threading.Lock()


def emit(event, **fields):
    line = json.dumps({"event": event, "wall": time.time(), **fields})
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def exit_when_stdin_closes(on_line=None):
    """Exits the process (at once: TF's servers do not stop cleanly) when stdin closes; passes
    each line to on_line meanwhile."""

    def watch():
        for line in sys.stdin:
            if on_line is not None:
                on_line(line.strip())
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="stdin-watch").start()


def import_tf():
    import tensorflow as tf  # noqa: PLC0415

    return tf


def error_fields(e):
    """TF's error as {"code","message"}; other exceptions as UNKNOWN with their type."""
    code = getattr(e, "error_code", None)
    if code is not None:
        return {"code": CODE_NAMES.get(int(code), str(code)), "message": str(e.message)}
    return {"code": "UNKNOWN", "message": f"{type(e).__name__}: {e}"}


# ------------------------------------------------------------------------------------------------
# Servers


def cmd_dispatcher(args):
    exit_when_stdin_closes()
    tf = import_tf()
    svc = tf.data.experimental.service
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tf_service_dispatcher_")
    addresses = [a for a in (args.worker_addresses or "").split(",") if a]
    config = svc.DispatcherConfig(
        port=args.port,
        work_dir=work_dir,
        fault_tolerant_mode=True,
        worker_addresses=addresses or None,
        worker_timeout_ms=args.worker_timeout_ms,
    )
    server = svc.DispatchServer(config)
    emit("ready", address=server._address, work_dir=work_dir, worker_addresses=addresses)
    threading.Event().wait()


def cmd_worker(args):
    exit_when_stdin_closes()
    tf = import_tf()
    svc = tf.data.experimental.service
    # start=True returns once the worker is serving and has sent its first heartbeat.
    server = svc.WorkerServer(
        svc.WorkerConfig(
            dispatcher_address=args.dispatcher,
            port=args.port,
            heartbeat_interval_ms=args.heartbeat_ms,
        )
    )
    emit("ready", address=server._address)
    threading.Event().wait()


# ------------------------------------------------------------------------------------------------
# TFRecord files, framed here (no TF import: this runs while the servers start)


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def masked_crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data):
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def cmd_make_files(args):
    os.makedirs(args.dir, exist_ok=True)
    paths = []
    for f in range(args.files):
        path = os.path.join(args.dir, f"part-{f:05d}")
        with open(path, "wb") as out:
            for r in range(args.records):
                out.write(tfrecord(struct.pack("<q", f * args.records + r)))
        paths.append(path)
    emit("files", paths=paths, records=args.records)


# ------------------------------------------------------------------------------------------------
# Readers


def sharding_policy(tf, mode):
    svc = tf.data.experimental.service
    policies = {
        "off": svc.ShardingPolicy.OFF,
        "dynamic": svc.ShardingPolicy.DYNAMIC,
        "file": svc.ShardingPolicy.FILE,
        "data": svc.ShardingPolicy.DATA,
        "file_or_data": svc.ShardingPolicy.FILE_OR_DATA,
        "hint": svc.ShardingPolicy.HINT,
        # The legacy names, passed as TF's users pass them.
        "parallel_epochs": "parallel_epochs",
        "distributed_epoch": "distributed_epoch",
    }
    if mode not in policies:
        raise ValueError(f"unknown mode {mode!r}: one of {', '.join(policies)}")
    return policies[mode]


def build_dataset(tf, spec):
    """The dataset of `spec` (before distribute): its elements are int64 scalars."""
    kind, _, arg = spec["dataset"].partition(":")
    hint = spec.get("shard_hint", False)

    def shard_hint(ds):
        if hint:
            sh = tf.data.experimental.SHARD_HINT
            ds = ds.shard(sh, sh)
        return ds

    if kind == "range":
        ds = shard_hint(tf.data.Dataset.range(int(arg)))
        ds = ds.map(lambda x: x * 1).batch(5).unbatch()
    elif kind == "slices":
        import numpy as np  # noqa: PLC0415

        ds = shard_hint(tf.data.Dataset.from_tensor_slices(np.arange(int(arg), dtype=np.int64)))
        ds = ds.map(lambda x: x + 0).prefetch(4)
    elif kind == "files":
        files = shard_hint(tf.data.Dataset.list_files(os.path.join(arg, "*"), shuffle=False))
        ds = files.interleave(tf.data.TFRecordDataset, cycle_length=2, block_length=1)
        ds = ds.map(lambda r: tf.io.decode_raw(r, tf.int64)[0]).batch(4).unbatch()
    else:
        raise ValueError(f"unknown dataset {spec['dataset']!r}: range:N, slices:N or files:DIR")
    repeat = spec.get("repeat")
    if repeat is not None and repeat != 1:
        ds = ds.repeat(None if repeat < 0 else repeat)
    return ds


def distributed(tf, dispatcher, spec):
    svc = tf.data.experimental.service
    return build_dataset(tf, spec).apply(
        svc.distribute(
            processing_mode=sharding_policy(tf, spec.get("mode", "off")),
            service=f"grpc://{dispatcher}",
            job_name=spec.get("job_name"),
            num_consumers=spec.get("num_consumers"),
            consumer_index=spec.get("consumer_index"),
        )
    )


class Reader:
    """One reader thread: its elements so far, and whether it has reported its end."""

    def __init__(self, index, spec):
        self.index = index
        self.spec = spec
        self.lock = threading.Lock()
        self.elements = []
        self.walls = []
        self.start = None
        self.first = None
        self.reported = False
        self.failed = False
        self.finished = threading.Event()

    def report_done(self, stopped):
        with self.lock:
            if self.reported:
                return
            self.reported = True
            end = time.perf_counter()
            fields = {
                "reader": self.index,
                "elements": list(self.elements),
                "seconds": end - self.start if self.start is not None else 0.0,
                "first_seconds": self.first - self.start if self.first is not None else None,
            }
            if stopped:
                fields["stopped"] = True
            if self.spec.get("timestamps"):
                fields["walls"] = list(self.walls)
            emit("done", **fields)
        self.finished.set()

    def report_error(self, e):
        with self.lock:
            if self.reported:
                return
            self.reported = True
            self.failed = True
            emit("error", reader=self.index, read=len(self.elements), **error_fields(e))
        self.finished.set()

    def run(self, tf, dispatcher):
        try:
            every = self.spec.get("progress_every") or 0
            limit = self.spec.get("limit")
            stamp = bool(self.spec.get("timestamps"))
            watch_rewind = bool(self.spec.get("report_rewind"))
            highest = None
            with _build_lock:
                self.start = time.perf_counter()
                ds = distributed(tf, dispatcher, self.spec)
                if limit is not None and limit == 0:
                    self.report_done(False)
                    return
                values = ds.as_numpy_iterator()
            for value in values:
                now = time.perf_counter()
                with self.lock:
                    if self.reported:
                        return
                    if self.first is None:
                        self.first = now
                    self.elements.append(int(value))
                    if stamp:
                        self.walls.append(time.time())
                    n = len(self.elements)
                if watch_rewind:
                    v = int(value)
                    if highest is not None and v < highest:
                        emit("rewind", reader=self.index, index=n - 1, value=v, highest=highest)
                        watch_rewind = False
                    highest = v if highest is None else max(highest, v)
                if every and n % every == 0:
                    emit("progress", reader=self.index, read=n)
                if limit is not None and n >= limit:
                    break
            self.report_done(False)
        except Exception as e:  # noqa: BLE001
            self.report_error(e)


def read_specs(args):
    if args.specs is not None:
        specs = json.loads(args.specs)
    elif args.spec is not None:
        specs = [json.loads(args.spec)]
    else:
        specs = [
            {
                "dataset": args.dataset,
                "mode": args.mode,
                "job_name": args.job_name,
                "num_consumers": args.num_consumers,
                "consumer_index": args.consumer_index,
                "repeat": args.repeat,
                "limit": args.limit,
                "shard_hint": args.shard_hint,
                "progress_every": args.progress_every,
                "timestamps": args.timestamps,
                "report_rewind": args.report_rewind,
            }
        ]
    for s in specs:
        if "dataset" not in s or not s["dataset"]:
            raise ValueError(f"a read spec needs a dataset: {s}")
    return specs


def cmd_read(args):
    specs = read_specs(args)
    readers = [Reader(i, s) for i, s in enumerate(specs)]
    go = threading.Event()
    target = {"dispatcher": args.dispatcher}

    def on_line(line):
        parts = line.split()
        if len(parts) == 2 and parts[0] == "go" and not go.is_set():
            target["dispatcher"] = parts[1]
            go.set()
        elif len(parts) == 2 and parts[0] == "stop" and parts[1].isdigit():
            i = int(parts[1])
            if i < len(readers):
                readers[i].report_done(True)

    exit_when_stdin_closes(on_line)
    tf = import_tf()
    emit("imported", readers=len(readers))
    if target["dispatcher"] is None:
        go.wait()
    emit("started", readers=len(readers), dispatcher=target["dispatcher"])
    for r in readers:
        threading.Thread(
            target=r.run, args=(tf, target["dispatcher"]), daemon=True, name=f"reader-{r.index}"
        ).start()
    for r in readers:
        r.finished.wait()
    sys.stdout.flush()
    os._exit(1 if any(r.failed for r in readers) else 0)


# ------------------------------------------------------------------------------------------------
# Bad input


def take_all(ds, limit=None):
    out = []
    for v in ds.as_numpy_iterator():
        out.append(int(v))
        if limit is not None and len(out) >= limit:
            break
    return out


def attempt(fn, timeout):
    """fn() as a result: its elements, TF's error, or HUNG after `timeout` seconds (the thread is
    left behind; the process ends with os._exit)."""
    box = {}

    def run():
        try:
            box["r"] = {"ok": True, "elements": fn()}
        except Exception as e:  # noqa: BLE001
            box["r"] = {"ok": False, **error_fields(e)}

    t = threading.Thread(target=run, daemon=True)
    start = time.perf_counter()
    t.start()
    t.join(timeout)
    r = box.get("r", {"ok": False, "code": "HUNG", "message": f"no answer in {timeout}s"})
    r["seconds"] = time.perf_counter() - start
    return r


def bad_input_cases(tf, dispatcher, timeout):
    svc = tf.data.experimental.service
    target = f"grpc://{dispatcher}"
    P = svc.ShardingPolicy

    def dist(ds, mode, **kw):
        return ds.apply(svc.distribute(processing_mode=mode, service=target, **kw))

    def unknown_dataset_id():
        def read():
            ds = svc.from_dataset_id(
                processing_mode=P.OFF,
                service=target,
                dataset_id="424242",
                element_spec=tf.TensorSpec(shape=(), dtype=tf.int64),
            )
            return take_all(ds)

        return [attempt(read, timeout)]

    def job_mode_mismatch():
        base = tf.data.Dataset.range(10)
        first = attempt(lambda: take_all(dist(base, P.OFF, job_name="mismatch")), timeout)
        second = attempt(lambda: take_all(dist(base, P.DYNAMIC, job_name="mismatch")), timeout)
        return [first, second]

    def consumers_mismatch():
        base = tf.data.Dataset.range(10**12).repeat()
        # Consumer 0 of a 2-consumer job waits for consumer 1 before its first round, so it reads
        # in a thread of its own, started first; consumer 1 then claims 3 consumers.
        box = {}

        def first():
            box["r"] = attempt(
                lambda: take_all(
                    dist(base, P.OFF, job_name="consumers", num_consumers=2, consumer_index=0), 4
                ),
                timeout,
            )

        t = threading.Thread(target=first, daemon=True)
        t.start()
        time.sleep(1.0)
        second = attempt(
            lambda: take_all(
                dist(base, P.OFF, job_name="consumers", num_consumers=3, consumer_index=1), 4
            ),
            timeout,
        )
        t.join(timeout)
        return [box.get("r", {"ok": False, "code": "HUNG", "message": "no answer"}), second]

    def round_robin_finite():
        return [
            attempt(
                lambda: take_all(
                    dist(
                        tf.data.Dataset.range(10),
                        P.OFF,
                        job_name="rr_finite",
                        num_consumers=2,
                        consumer_index=0,
                    ),
                    1,
                ),
                timeout,
            )
        ]

    def static_unconfigured():
        return [attempt(lambda: take_all(dist(tf.data.Dataset.range(10), P.FILE_OR_DATA)), timeout)]

    return {
        "unknown-dataset-id": unknown_dataset_id,
        "job-mode-mismatch": job_mode_mismatch,
        "consumers-mismatch": consumers_mismatch,
        "round-robin-finite": round_robin_finite,
        "static-unconfigured": static_unconfigured,
    }


def cmd_bad_input(args):
    exit_when_stdin_closes()
    tf = import_tf()
    cases = bad_input_cases(tf, args.dispatcher, args.case_timeout)
    names = [c for c in args.cases.split(",") if c]
    for name in names:
        if name not in cases:
            raise ValueError(f"unknown case {name!r}: one of {', '.join(cases)}")
    for name in names:
        emit("case", case=name, results=cases[name]())
    emit("finished")
    sys.stdout.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("dispatcher")
    d.add_argument("--worker-addresses", default="")
    d.add_argument("--port", type=int, default=0)
    d.add_argument("--work-dir", default=None)
    d.add_argument("--worker-timeout-ms", type=int, default=None)

    w = sub.add_parser("worker")
    w.add_argument("--dispatcher", required=True)
    w.add_argument("--port", type=int, default=0)
    w.add_argument("--heartbeat-ms", type=int, default=500)

    m = sub.add_parser("make-files")
    m.add_argument("--dir", required=True)
    m.add_argument("--files", type=int, required=True)
    m.add_argument("--records", type=int, required=True)

    r = sub.add_parser("read")
    r.add_argument("--dispatcher", default=None, help="default: a line 'go ADDR' on stdin")
    r.add_argument("--specs", default=None, help="a JSON list of read specs")
    r.add_argument("--spec", default=None, help="one JSON read spec")
    r.add_argument("--dataset", default=None)
    r.add_argument("--mode", default="off")
    r.add_argument("--job-name", default=None)
    r.add_argument("--num-consumers", type=int, default=None)
    r.add_argument("--consumer-index", type=int, default=None)
    r.add_argument("--repeat", type=int, default=None, help="-1: forever")
    r.add_argument("--limit", type=int, default=None)
    r.add_argument("--shard-hint", action="store_true")
    r.add_argument("--progress-every", type=int, default=0)
    r.add_argument("--timestamps", action="store_true")
    r.add_argument("--report-rewind", action="store_true")

    b = sub.add_parser("bad-input")
    b.add_argument("--dispatcher", required=True)
    b.add_argument("--cases", required=True)
    b.add_argument("--case-timeout", type=float, default=30.0)

    args = p.parse_args()
    {
        "dispatcher": cmd_dispatcher,
        "worker": cmd_worker,
        "make-files": cmd_make_files,
        "read": cmd_read,
        "bad-input": cmd_bad_input,
    }[args.cmd](args)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        emit("error", reader=None, **error_fields(e))
        print(f"tf_service: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)  # not sys.exit: TF's servers and threads can hang the interpreter's exit

#!/usr/bin/env python3
"""TensorFlow's side of `coord-bench tfdata`: real tf.data service processes, pointed at TF's own
dispatcher or at a coord-proxy (the same code for both).

Every process prints JSON event lines on stdout (each with "event" and "wall", time.time()) and
exits at once when its stdin closes (tf_service.py's conventions, whose helpers it imports), so
nothing outlives the benchmark. TF's logs go to stderr.

Subcommands:

  dispatcher --port P --work-dir D [--standby]
      TF's DispatchServer, fault_tolerant_mode=True, journal in D. Imports TF, prints
      {"event":"imported"}; with --standby it then waits for a line "go" on stdin (TF's best case
      after a crash: a process with TF already imported takes over the journal at once). Then
      constructs the server (start=True returns once the journal is replayed and it serves):
      -> {"event":"ready","address","construct_wall"}

  workers --dispatchers A[,B...] --count K [--heartbeat-ms MS]
      K WorkerServers for each dispatcher address, all in this process (C++ servers: several per
      process share the one TF import). -> {"event":"ready","workers":{A:[addr...],...}}

  reader
      One long-lived client process (no workers in it: a reader in a worker's process reads from
      it through TF's in-process shortcut, see tf_peer.py). Imports TF, prints {"event":
      "imported"}, then runs one read per stdin line "read TAG ADDR N INTS MODE COPIES BATCH_ON":
      range(N), each element made a vector of INTS copies of itself if INTS > 1,
      distribute(processing_mode=MODE) through ADDR ("distributed_epoch", or "parallel_epochs":
      every worker produces it all), batched by 256 on the client (BATCH_ON "client": each
      element is one GetElement call) or on the workers before distribute ("workers": each batch
      is one, and a worker asks for 256 splits per batch). Checks that every element 0..N-1 came
      exactly COPIES times (1 under distributed_epoch; the number of workers under
      parallel_epochs).
      -> {"event":"read","tag","ok":true,"seconds","counted","rate"}: the clock runs from the first
         batch's arrival to the last one's, and counts the elements after the first batch.
      -> {"event":"read","tag","ok":false,"code","message"}

  splits --dispatcher ADDR
      A fake worker measuring the dispatcher's outages. Registers range(2**62) with TF's client,
      makes a DYNAMIC job and an iteration with raw RPCs (as capture_split_fixtures.py does; the
      iteration has a client, which heartbeats every second, and a fake worker that holds its
      task), then calls GetSplit back to back, retrying any error after 2 ms.
      -> {"event":"ready","iteration_id"}
      -> {"event":"progress","splits","errors","p50_ms","p99_ms"} each second: answers so far,
         failed calls so far, GetSplit latency over the last second
      Each stdin line "since T W" (T: a wall time, the dispatcher's kill) asks for the end of the
      outage that followed T: of the answers that came from T to T + W seconds (kept as they
      come, so the line may arrive late), the one that ended the longest wait, reported once an
      answer came after T + W. It is the longest wait, not the first answer after T, because
      answers already on their way at T, or splits a proxy holds, may come first.
      -> {"event":"after","since","prev","wall","split","expected","errors"}: when the answer
         before it came (prev), when it came (wall), the split it handed out and the one that
         followed the previous (a split lost across the outage shows as split > expected), and
         the errors between them by code.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tf"))

from tf_service import emit, error_fields, exit_when_stdin_closes, import_tf  # noqa: E402

import argparse  # noqa: E402
import collections  # noqa: E402
import queue  # noqa: E402
import struct  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

BATCH = 256
# The fake worker of `splits`: a port nothing listens on, so a pushed task fails at once.
FAKE_WORKER = "127.0.0.1:1"
DYNAMIC = 1


def cmd_dispatcher(args):
    go = threading.Event()
    exit_when_stdin_closes(lambda line: go.set() if line == "go" else None)
    tf = import_tf()
    svc = tf.data.experimental.service
    emit("imported")
    if args.standby:
        go.wait()
    construct_wall = time.time()
    server = svc.DispatchServer(
        svc.DispatcherConfig(port=args.port, work_dir=args.work_dir, fault_tolerant_mode=True)
    )
    emit("ready", address=server._address, construct_wall=construct_wall)
    threading.Event().wait()


def cmd_workers(args):
    exit_when_stdin_closes()
    tf = import_tf()
    svc = tf.data.experimental.service
    servers = {}
    for d in [a for a in args.dispatchers.split(",") if a]:
        servers[d] = [
            svc.WorkerServer(
                svc.WorkerConfig(dispatcher_address=d, heartbeat_interval_ms=args.heartbeat_ms)
            )
            for _ in range(args.count)
        ]
    emit("ready", workers={d: [w._address for w in ws] for d, ws in servers.items()})
    threading.Event().wait()


def timed_read(tf, address, n, ints, mode, copies, batch_on):
    import numpy as np  # noqa: PLC0415

    svc = tf.data.experimental.service
    ds = tf.data.Dataset.range(n)
    if ints > 1:
        ds = ds.map(lambda x: tf.fill([ints], x))
    if batch_on == "workers":
        ds = ds.batch(BATCH)
    ds = ds.apply(svc.distribute(processing_mode=mode, service=f"grpc://{address}"))
    if batch_on == "client":
        ds = ds.batch(BATCH)
    chunks = []
    first = last = None
    for b in ds:
        now = time.perf_counter()
        if first is None:
            first = now
        last = now
        a = b.numpy()
        if ints > 1:
            if not (a == a[:, :1]).all():
                return {"ok": False, "code": "BAD_ELEMENT", "message": "a vector of mixed values"}
            a = a[:, 0]
        chunks.append(a)
    if not chunks:
        return {"ok": False, "code": "EMPTY", "message": "no element was read"}
    values = np.sort(np.concatenate(chunks))
    want = np.repeat(np.arange(n, dtype=values.dtype), copies)
    if not np.array_equal(values, want):
        return {
            "ok": False,
            "code": "NOT_EXACT",
            "message": f"{len(values)} elements read, {len(np.unique(values))} distinct, not "
            f"exactly 0..{n - 1} {copies} time(s) each",
        }
    counted = len(values) - len(chunks[0])
    seconds = last - first
    return {"ok": True, "seconds": seconds, "counted": counted, "rate": counted / seconds}


def cmd_reader(args):
    lines = queue.Queue()
    exit_when_stdin_closes(lines.put)
    tf = import_tf()
    emit("imported")
    while True:
        parts = lines.get().split()
        if len(parts) != 8 or parts[0] != "read" or parts[7] not in ("client", "workers"):
            continue
        _, tag, address, n, ints, mode, copies, batch_on = parts
        try:
            result = timed_read(tf, address, int(n), int(ints), mode, int(copies), batch_on)
        except Exception as e:  # noqa: BLE001
            result = {"ok": False, **error_fields(e)}
        emit("read", tag=tag, **result)


class Dispatcher:
    """Raw gRPC calls of `tensorflow.data.DispatcherService`, with messages from TF's schema."""

    def __init__(self, address):
        import grpc  # noqa: PLC0415
        import tf_schema  # noqa: PLC0415
        from google.protobuf import descriptor_pool, message_factory  # noqa: PLC0415

        tf_schema.load("tensorflow/core/data/service/dispatcher.proto")
        pool = descriptor_pool.Default()
        self.cls = lambda name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"tensorflow.data.{name}")
        )
        self.grpc = grpc
        # Reconnect at once after the dispatcher comes back: gRPC's default backoff (1 s, then
        # longer) would be counted as the dispatcher's outage.
        self.channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 10),
                ("grpc.min_reconnect_backoff_ms", 10),
                ("grpc.max_reconnect_backoff_ms", 100),
                ("grpc.enable_retries", 0),
            ],
        )
        self.stubs = {}

    def call(self, method, timeout=30.0, **fields):
        if method not in self.stubs:
            self.stubs[method] = self.channel.unary_unary(
                f"/tensorflow.data.DispatcherService/{method}",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=self.cls(f"{method}Response").FromString,
            )
        return self.stubs[method](self.cls(f"{method}Request")(**fields), timeout=timeout)


def longest_wait_after(recent, t, w):
    """Of the `recent` answers after wall time `t` whose wait began before `t + w`, the one that
    ended the longest wait, with the answer before it (newest first: a deque is cheap to walk,
    not to index)."""
    best = later = None
    for answer in reversed(recent):
        if later is not None:
            if later[0] <= t:
                break
            if answer[0] < t + w and (best is None or later[0] - answer[0] > best[0]):
                best = (later[0] - answer[0], answer[0], later)
        later = answer
    if best is None:  # no answer before `t` is kept: the last one stands alone
        best = (0.0, None, recent[-1])
    _, prev, (wall, split, expected, errors) = best
    return {"prev": prev, "wall": wall, "split": split, "expected": expected, "errors": errors}


def split_value(tensor):
    """The int64 scalar a range's split is (TF sends it as tensor_content)."""
    if tensor.int64_val:
        return tensor.int64_val[0]
    return struct.unpack("<q", tensor.tensor_content[:8])[0]


# Answers the fake worker of `splits` keeps, for "since" questions about the last seconds.
RECENT_ANSWERS = 50_000


def cmd_splits(args):
    sinces = queue.Queue()
    exit_when_stdin_closes(
        lambda line: sinces.put(tuple(map(float, line.split()[1:3])))
        if line.startswith("since ")
        else None
    )
    tf = import_tf()
    d = Dispatcher(args.dispatcher)
    d.call("WorkerHeartbeat", worker_address=FAKE_WORKER)
    dataset_id = (
        tf.data.experimental.service.register_dataset(
            f"grpc://{args.dispatcher}", tf.data.Dataset.range(2**62)
        )
        .numpy()
        .decode()
    )
    mode = d.cls("ProcessingModeDef")(sharding_policy=DYNAMIC)
    job = d.call(
        "GetOrCreateJob", dataset_id=dataset_id, processing_mode_def=mode, job_name="outage"
    )
    client = d.call("GetOrCreateIteration", job_id=job.job_id, repetition=0)
    tasks = [t for t in d.call("WorkerHeartbeat", worker_address=FAKE_WORKER).new_tasks]
    if len(tasks) != 1:
        raise RuntimeError(f"the fake worker got {len(tasks)} tasks, not 1")
    iteration = tasks[0].iteration_id

    def heartbeats():
        while True:
            time.sleep(1.0)
            for method, fields in (
                ("ClientHeartbeat", {"iteration_client_id": client.iteration_client_id}),
                ("WorkerHeartbeat", {"worker_address": FAKE_WORKER,
                                     "current_tasks": [tasks[0].task_id]}),
            ):
                try:
                    d.call(method, timeout=5.0, **fields)
                except d.grpc.RpcError:
                    pass

    threading.Thread(target=heartbeats, daemon=True).start()
    emit("ready", iteration_id=iteration)
    get_split = d.channel.unary_unary(
        "/tensorflow.data.DispatcherService/GetSplit",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=d.cls("GetSplitResponse").FromString,
    )
    request = d.cls("GetSplitRequest")(iteration_id=iteration, repetition=0, split_provider_index=0)
    splits = errors = 0
    since_answer = {}
    latencies = []
    expected = None
    # (wall, split, the split that followed the previous answer, errors since the previous)
    recent = collections.deque(maxlen=RECENT_ANSWERS)
    asked = []
    next_progress = time.time() + 1.0
    while True:
        t0 = time.perf_counter()
        try:
            resp = get_split(request, timeout=args.call_timeout)
        except d.grpc.RpcError as e:
            errors += 1
            code = e.code().name
            since_answer[code] = since_answer.get(code, 0) + 1
            time.sleep(0.002)
            continue
        now = time.time()
        if resp.end_of_splits:
            raise RuntimeError(f"end of splits after {splits} splits")
        latencies.append(time.perf_counter() - t0)
        value = split_value(resp.split)
        splits += 1
        recent.append((now, value, expected, since_answer))
        since_answer = {}
        expected = value + 1
        while not sinces.empty():
            asked.append(sinces.get_nowait())
        for t, w in [(t, w) for t, w in asked if now > t + w]:
            asked.remove((t, w))
            emit("after", since=t, **longest_wait_after(recent, t, w))
        if now >= next_progress:
            latencies.sort()
            emit(
                "progress",
                splits=splits,
                errors=errors,
                p50_ms=latencies[len(latencies) // 2] * 1e3,
                p99_ms=latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] * 1e3,
            )
            latencies = []
            next_progress = now + 1.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dispatcher")
    d.add_argument("--port", type=int, required=True)
    d.add_argument("--work-dir", required=True)
    d.add_argument("--standby", action="store_true")
    w = sub.add_parser("workers")
    w.add_argument("--dispatchers", required=True)
    w.add_argument("--count", type=int, required=True)
    w.add_argument("--heartbeat-ms", type=int, default=500)
    sub.add_parser("reader")
    s = sub.add_parser("splits")
    s.add_argument("--dispatcher", required=True)
    s.add_argument("--call-timeout", type=float, default=30.0)
    args = p.parse_args()
    {
        "dispatcher": cmd_dispatcher,
        "workers": cmd_workers,
        "reader": cmd_reader,
        "splits": cmd_splits,
    }[args.cmd](args)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        emit("error", **error_fields(e))
        print(f"tf_bench: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)  # not sys.exit: TF's servers and threads can hang the interpreter's exit

#!/usr/bin/env python3
"""Captures, from TensorFlow's own tf.data service, the fixtures of `coord_proto::tf_dataset`.

For every pipeline in SCENARIOS this script records two things from the real thing:

  1. the exact `DatasetDef` bytes a TensorFlow client sends to the dispatcher
     (`tf.data.experimental.service.register_dataset`, the same `_register_dataset` that
     `distribute` uses), caught by a byte-level gRPC proxy in front of the dispatcher; and
  2. what TensorFlow's own `DispatchServer` answers for it under dynamic sharding
     ("distributed_epoch"): how many split providers it made (the `num_split_providers` of the
     task it hands a worker) and every split of each (`GetSplit`, repetition 0, until
     `end_of_splits`), or the error it refused the iteration with.

It also records what TensorFlow's `MatchingFiles` (the op behind `list_files`) returns for a few
glob patterns on a small directory tree, for the local-filesystem glob of the same module.

Output (default: proto/tests/fixtures/tf_datasets/ under this repository's root):

  <name>.pb     the DatasetDef bytes of scenario <name>
  splits.json   {"tf_version", "scenarios": [{"name", "python", "def", ...answer}]}, where the
                answer is either {"num_split_providers", "providers": [{"splits": [hex of each
                split's TensorProto], "values": [...], "truncated"}]} or
                {"refused": {"code", "message"}}; "truncated" marks a provider read only up to
                MAX_SPLITS splits (infinite or huge ones).
  glob.json     {"tree": [relative paths], "cases": [{"pattern", "matches"}]}, paths relative to
                the tree's root.

How to regenerate (needs TensorFlow 2.21; the repository's venv has it):

  target/tf-venv-2.21.0/bin/python tests/tfdata/capture_split_fixtures.py [--out DIR]

then `cargo test -p coord-proto tf_dataset`. It takes about ten seconds. `--only a,b` runs some
scenarios and prints their answers, writing nothing. The data files the pipelines read are
written under FILES_ROOT, a fixed path, because their names end up inside the DatasetDefs;
nothing under it is needed afterwards.

Process layout: the dispatcher and the proxy each run in a process of their own (this script
re-executed with `dispatcher` / `proxy`); the TF client and the plain gRPC calls that play the
worker (a fake worker's heartbeats, then GetSplit) run here. No TF WorkerServer is started: the
dispatcher makes its split providers when the iteration is created, and GetSplit needs no worker.
Children exit when their stdin closes, so they die with this process.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES_ROOT = "/tmp/coord-tf-split-fixtures"
MAX_SPLITS = 16
FAKE_WORKER = "fake-worker.invalid:1"

# name -> Python expression (tf, np and D, the data directory, in scope) making the dataset.
SCENARIOS = [
    # RangeDataset: the splits are the range's values.
    ("range_10", "tf.data.Dataset.range(10)"),
    ("range_start_step", "tf.data.Dataset.range(3, 20, 4)"),
    ("range_negative_step", "tf.data.Dataset.range(10, -5, -3)"),
    ("range_empty", "tf.data.Dataset.range(5, 5)"),
    ("range_backwards_empty", "tf.data.Dataset.range(5, 0)"),
    ("range_int32", "tf.data.Dataset.range(-2, 3, output_type=tf.int32)"),
    ("range_to_int64_max", "tf.data.Dataset.range(9223372036854775804, 9223372036854775807)"),
    ("counter", "tf.data.Dataset.counter(5)"),
    # TF's counter overflows int64 past the last value and wraps around (C++ undefined
    # behaviour); coord refuses such a range.
    ("range_overflow", "tf.data.Dataset.range(9223372036854775800, 9223372036854775807, 3)"),
    # TensorSliceDataset: the splits are indexes 0..n-1, n = the first dimension.
    ("slices_list", "tf.data.Dataset.from_tensor_slices([10, 20, 30, 40, 50])"),
    ("slices_tuple", "tf.data.Dataset.from_tensor_slices(([1, 2, 3], ['a', 'b', 'c']))"),
    ("slices_dict",
     "tf.data.Dataset.from_tensor_slices("
     "{'x': np.arange(12).reshape(6, 2), 'y': np.ones(6, np.float32)})"),
    ("slices_numpy_2d", "tf.data.Dataset.from_tensor_slices(np.zeros((7, 3), np.float32))"),
    ("slices_empty", "tf.data.Dataset.from_tensor_slices(np.zeros((0, 2), np.int32))"),
    ("from_tensors", "tf.data.Dataset.from_tensors([1, 2, 3])"),
    ("from_list", "tf.data.experimental.from_list([(1, 'a'), (2, 'b'), (3, 'c')])"),
    # Files: list_files and the readers' own from_tensor_slices + flat_map / interleave.
    ("list_files_interleave",
     "tf.data.Dataset.list_files(D + '/*.tfrecord', shuffle=False)"
     ".interleave(tf.data.TFRecordDataset, cycle_length=2)"),
    ("list_files_flat_map",
     "tf.data.Dataset.list_files(D + '/*.tfrecord', shuffle=False)"
     ".flat_map(tf.data.TFRecordDataset).map(lambda x: tf.strings.length(x))"),
    ("list_files_parallel_interleave",
     "tf.data.Dataset.list_files(D + '/f[01].tfrecord', shuffle=False)"
     ".interleave(tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2)"),
    ("tfrecord_files", "tf.data.TFRecordDataset([D + '/f0.tfrecord', D + '/f2.tfrecord'])"),
    ("tfrecord_one_file", "tf.data.TFRecordDataset(D + '/f1.tfrecord')"),
    ("tfrecord_parallel_reads",
     "tf.data.TFRecordDataset([D + '/f0.tfrecord', D + '/f1.tfrecord', D + '/f2.tfrecord'],"
     " num_parallel_reads=2)"),
    ("text_lines", "tf.data.TextLineDataset([D + '/a.txt', D + '/b.txt'])"),
    ("fixed_length",
     "tf.data.FixedLengthRecordDataset([D + '/a.txt'], record_bytes=2)"),
    # Unary transformations in front of a source.
    ("range_pipeline",
     "tf.data.Dataset.range(3, 20, 4).map(lambda x: x * 2).filter(lambda x: x > 0)"
     ".shuffle(4, seed=1).repeat(2).skip(1).take(7).batch(2).prefetch(1)"),
    ("slices_pipeline",
     "tf.data.Dataset.from_tensor_slices(np.arange(9)).map(lambda x: x + 1,"
     " num_parallel_calls=2).padded_batch(2).unbatch().cache().shard(2, 0)"
     ".apply(tf.data.experimental.assert_cardinality(5))"),
    ("range_interleave_range",
     "tf.data.Dataset.range(1, 4).interleave(lambda x: tf.data.Dataset.range(x),"
     " cycle_length=2)"),
    ("range_flat_map_slices",
     "tf.data.Dataset.range(3).flat_map("
     "lambda x: tf.data.Dataset.from_tensor_slices([x, x]))"),
    ("range_windows",
     "tf.data.Dataset.range(6).window(2).flat_map(lambda w: w)"
     ".scan(tf.constant(0, tf.int64), lambda s, x: (s + x, s))"),
    ("range_misc",
     "tf.data.Dataset.range(8).ignore_errors().take_while(lambda x: x < 6).unique()"
     ".batch(4).rebatch(2).unbatch().group_by_window(lambda x: x % 2,"
     " lambda k, w: w.batch(2), window_size=2)"),
    ("range_batching",
     "tf.data.Dataset.range(10).batch(3, num_parallel_calls=2).unbatch()"
     ".apply(tf.data.experimental.map_and_batch(lambda x: x, 2)).unbatch()"
     ".ragged_batch(2).unbatch().map(lambda x: tf.reshape(x, [1])).sparse_batch(2, [1])"
     ".map(lambda s: s.values).unbatch()"),
    ("range_bucketing",
     "tf.data.Dataset.range(6).bucket_by_sequence_length(lambda x: tf.constant(1), [3], [1, 1])"),
    ("range_shuffle_unseeded",
     "tf.data.Dataset.range(5).shuffle(3).repeat().take(7)"),
    ("range_snapshot",
     "tf.data.Dataset.range(4).snapshot(D + '/snapshot')"),
    ("range_options",
     "tf.data.Dataset.range(4).with_options(tf.data.Options())"
     ".apply(tf.data.experimental.assert_cardinality(4))"),
    # More than one source: one split provider per source, in input order.
    ("zip", "tf.data.Dataset.zip((tf.data.Dataset.range(4),"
     " tf.data.Dataset.from_tensor_slices([7, 8, 9, 10, 11])))"),
    ("zip_nested",
     "tf.data.Dataset.zip({'a': tf.data.Dataset.range(2), 'b': (tf.data.Dataset.range(5, 7),"
     " tf.data.Dataset.from_tensors(1))})"),
    ("concatenate",
     "tf.data.Dataset.range(3).concatenate(tf.data.Dataset.range(10, 12))"),
    ("enumerate", "tf.data.Dataset.from_tensor_slices(['a', 'b', 'c']).enumerate(5)"),
    ("sample_from_datasets",
     "tf.data.Dataset.sample_from_datasets([tf.data.Dataset.range(3),"
     " tf.data.Dataset.range(100, 102)], seed=1, stop_on_empty_dataset=True)"),
    ("choose_from_datasets",
     "tf.data.Dataset.choose_from_datasets([tf.data.Dataset.range(3),"
     " tf.data.Dataset.range(100, 102)], tf.data.Dataset.from_tensor_slices("
     "tf.constant([0, 1, 0], tf.int64)))"),
    ("random", "tf.data.Dataset.random(seed=1).take(3)"),
    ("random_unseeded", "tf.data.Dataset.random().take(2)"),
    # What TF refuses (or what has no split provider of its own).
    ("from_generator",
     "tf.data.Dataset.from_generator(lambda: iter([1, 2]),"
     " output_signature=tf.TensorSpec([], tf.int32))"),
    ("sparse_slices",
     "tf.data.Dataset.from_tensor_slices(tf.sparse.SparseTensor([[0, 0], [1, 1]], [1, 2],"
     " [3, 2]))"),
    ("group_by_reducer",
     "tf.data.Dataset.range(6).apply(tf.data.experimental.group_by_reducer(lambda x: x % 2,"
     " tf.data.experimental.Reducer(lambda k: tf.constant(0, tf.int64),"
     " lambda s, x: s + x, lambda s: s)))"),
    ("csv", "tf.data.experimental.CsvDataset(D + '/c.csv', [tf.int32])"),
    ("tfrecord_reader_alone", "readers._TFRecordDataset(D + '/f0.tfrecord')"),
    ("text_line_reader_alone", "readers._TextLineDataset(D + '/a.txt').map(tf.strings.length)"),
    ("fixed_length_reader_alone",
     "readers._FixedLengthRecordDataset(D + '/a.txt', 2).batch(2)"),
    ("zip_with_reader_alone",
     "tf.data.Dataset.zip((tf.data.Dataset.range(3),"
     " readers._TFRecordDataset(D + '/f0.tfrecord')))"),
    ("tfrecord_direct_in_zip",
     "tf.data.Dataset.zip((tf.data.Dataset.range(2),"
     " tf.data.Dataset.from_tensors(0).flat_map("
     "lambda _: tf.data.TFRecordDataset(D + '/f0.tfrecord'))))"),
]

# Graphs no TF 2.21 client sends (it serializes every tensor a dataset holds as a Const), built
# in graph mode and sent to the dispatcher as they are: name -> Python statements that leave the
# dataset in `ds` (tf, D in scope; run inside a tf.Graph). The graph gets a `_Retval` node on
# `ds`, as a client's graph has, unless the name says "no_retval".
GRAPH_SCENARIOS = [
    ("graph_list_files",
     "ds = tf.data.Dataset.list_files(D + '/*.tfrecord', shuffle=False)"
     ".interleave(tf.data.TFRecordDataset, cycle_length=2)"),
    ("graph_list_files_two_patterns",
     "ds = tf.data.Dataset.list_files([D + '/f[12].tfrecord', D + '/*.txt', D + '/f1*'],"
     " shuffle=False)"),
    ("graph_list_files_no_match",
     "ds = tf.data.Dataset.list_files(D + '/*.nothing', shuffle=False)"),
    ("graph_slices_random", "ds = tf.data.Dataset.from_tensor_slices(tf.random.uniform([5]))"),
    ("graph_no_retval", "ds = tf.data.Dataset.range(3)"),
]

# (pattern relative to the glob tree, ...) checked against MatchingFiles.
GLOB_TREE = [
    "a.txt", "b.txt", "c.dat", ".hidden.txt", "x[1].txt", "sub/d.txt", "sub/e.dat",
    "sub/deeper/f.txt", "sub2/g.txt", "ñ.txt",
]
GLOB_PATTERNS = [
    "*.txt", "*", "?.txt", "[ab].txt", "[!a].txt", "[^a].txt", "*/*.txt", "*/*/*.txt",
    "sub/*", "sub*/*.txt", "x\\[1\\].txt", "x[[]1].txt", "a.txt", "missing.txt", "sub",
    "sub/", "*/", "nomatch*", "?.t?t", "[a-b].txt", "[[:alpha:]].txt", "*.[td]*",
    "ñ.txt", "sub/deeper/../d.txt",
]


def dispatcher_main():
    import tensorflow as tf

    d = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0))
    print(int(d.target.split(":")[-1]), flush=True)
    sys.stdin.read()
    os._exit(0)


def proxy_main(target, dump_dir):
    """Forwards every call as bytes; writes each GetOrRegisterDataset request to dump_dir."""
    from concurrent import futures

    import grpc

    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    channel = grpc.insecure_channel(target, options=opts)
    counter = [0]
    lock = threading.Lock()

    class Forward(grpc.GenericRpcHandler):
        def service(self, details):
            method = details.method
            call = channel.unary_unary(method)

            def handler(request, context):
                if method.endswith("/GetOrRegisterDataset"):
                    with lock:
                        counter[0] += 1
                        path = os.path.join(dump_dir, "%06d.bin" % counter[0])
                    with open(path + ".tmp", "wb") as f:
                        f.write(request)
                    os.rename(path + ".tmp", path)
                try:
                    return call(request, timeout=60)
                except grpc.RpcError as e:
                    context.abort(e.code(), e.details())

            return grpc.unary_unary_rpc_method_handler(handler)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=opts)
    server.add_generic_rpc_handlers((Forward(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    os._exit(0)


def spawn(*args):
    p = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"child {args[0]} did not start")
    return p, int(line)


def write_data_files(tf, d):
    shutil.rmtree(FILES_ROOT, ignore_errors=True)
    os.makedirs(d)
    for i in range(3):
        with tf.io.TFRecordWriter(f"{d}/f{i}.tfrecord") as w:
            for j in range(i + 1):
                w.write(f"record {i}.{j}".encode())
    with open(f"{d}/a.txt", "w") as f:
        f.write("line a1\nline a2\n")
    with open(f"{d}/b.txt", "w") as f:
        f.write("line b1\n")
    with open(f"{d}/c.csv", "w") as f:
        f.write("1\n2\n")


def messages():
    sys.path.insert(0, os.path.join(ROOT, "tests", "tf"))
    import tf_schema
    from google.protobuf import descriptor_pool, message_factory

    tf_schema.load("tensorflow/core/data/service/dispatcher.proto")
    pool = descriptor_pool.Default()

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return cls


class Dispatcher:
    """Plain gRPC calls to TF's dispatcher, the client's and a worker's part played by hand."""

    def __init__(self, port, cls):
        import grpc

        self.grpc = grpc
        self.cls = cls
        self.channel = grpc.insecure_channel(f"localhost:{port}")
        self.known_tasks = []

    def call(self, method, request, response_type):
        fn = self.channel.unary_unary(
            f"/tensorflow.data.DispatcherService/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.cls(f"tensorflow.data.{response_type}").FromString)
        return fn(request, timeout=60)

    def heartbeat(self):
        req = self.cls("tensorflow.data.WorkerHeartbeatRequest")(
            worker_address=FAKE_WORKER, current_tasks=self.known_tasks)
        resp = self.call("WorkerHeartbeat", req, "WorkerHeartbeatResponse")
        for task in resp.new_tasks:
            self.known_tasks.append(task.task_id)
        return list(resp.new_tasks)

    def splits(self, dataset_id, job_name):
        """Creates a distributed_epoch iteration and reads every provider's splits."""
        cls = self.cls
        mode = cls("tensorflow.data.ProcessingModeDef")(sharding_policy=1)  # DYNAMIC
        try:
            job = self.call("GetOrCreateJob", cls("tensorflow.data.GetOrCreateJobRequest")(
                dataset_id=dataset_id, processing_mode_def=mode, job_name=job_name),
                "GetOrCreateJobResponse")
            self.call("GetOrCreateIteration", cls("tensorflow.data.GetOrCreateIterationRequest")(
                job_id=job.job_id, repetition=0), "GetOrCreateIterationResponse")
        except self.grpc.RpcError as e:
            return {"refused": {"code": e.code().name, "message": e.details()}}
        tasks = [t for t in self.heartbeat() if t.dataset_id == dataset_id]
        if len(tasks) != 1:
            raise SystemExit(f"{job_name}: expected one new task, got {tasks}")
        task = tasks[0]
        providers = []
        for index in range(task.num_split_providers):
            first = self.read_provider(task.iteration_id, 0, index)
            again = self.read_provider(task.iteration_id, 1, index)
            if first != again:
                raise SystemExit(f"{job_name}: repetition 1 differs from repetition 0")
            providers.append(first)
        return {"num_split_providers": task.num_split_providers, "providers": providers}

    def read_provider(self, iteration_id, repetition, index):
        from tensorflow.python.framework import tensor_util

        splits, values = [], []
        truncated = True
        for _ in range(MAX_SPLITS):
            resp = self.call("GetSplit", self.cls("tensorflow.data.GetSplitRequest")(
                iteration_id=iteration_id, repetition=repetition, split_provider_index=index),
                "GetSplitResponse")
            if resp.end_of_splits:
                truncated = False
                break
            splits.append(resp.split.SerializeToString(deterministic=True).hex())
            values.append(tensor_util.MakeNdarray(resp.split).tolist())
        return {"splits": splits, "values": values, "truncated": truncated}


def graph_mode_def(tf, cls, name, statements, data_dir):
    """The DatasetDef of a dataset built in graph mode: the Python graph itself, plus _Retval."""
    from tensorflow.core.framework import node_def_pb2, types_pb2

    g = tf.Graph()
    scope = {"tf": tf, "D": data_dir}
    with g.as_default():
        exec(statements, scope)
    graph = g.as_graph_def()
    if "no_retval" not in name:
        retval = node_def_pb2.NodeDef(name="dataset", op="_Retval",
                                      input=[scope["ds"]._variant_tensor.op.name])
        retval.attr["T"].type = types_pb2.DT_VARIANT
        retval.attr["index"].i = 0
        graph.node.append(retval)
    definition = cls("tensorflow.data.DatasetDef")()
    definition.graph.ParseFromString(graph.SerializeToString())
    return definition


def capture_globs(tf, out):
    root = os.path.join(FILES_ROOT, "glob")
    for rel in GLOB_TREE:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(rel)
    cases = []
    for pattern in GLOB_PATTERNS:
        got = tf.io.matching_files(os.path.join(root, pattern)).numpy().tolist()
        got = [g.decode() for g in got]
        if any(not g.startswith(root + "/") for g in got):
            raise SystemExit(f"glob {pattern}: result outside the tree: {got}")
        cases.append({"pattern": pattern, "matches": [g[len(root) + 1:] for g in got]})
    with open(os.path.join(out, "glob.json"), "w") as f:
        json.dump({"tree": GLOB_TREE, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "proto", "tests", "fixtures",
                                                      "tf_datasets"))
    parser.add_argument("--only", help="comma-separated scenario names")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.data.ops import readers

    cls = messages()
    data_dir = os.path.join(FILES_ROOT, "data")
    write_data_files(tf, data_dir)
    dump_dir = os.path.join(FILES_ROOT, "dumps")
    os.makedirs(dump_dir)

    dispatcher, dport = spawn("dispatcher")
    proxy, pport = spawn("proxy", f"localhost:{dport}", dump_dir)
    try:
        disp = Dispatcher(dport, cls)
        disp.heartbeat()  # registers the fake worker before any iteration exists
        request_type = cls("tensorflow.data.GetOrRegisterDatasetRequest")
        only = set(args.only.split(",")) if args.only else None
        results = []
        for name, expr in SCENARIOS:
            if only and name not in only:
                continue
            seen = set(os.listdir(dump_dir))
            ds = eval(expr, {"tf": tf, "np": np, "D": data_dir, "readers": readers})
            dataset_id = tf.data.experimental.service.register_dataset(
                f"grpc://localhost:{pport}", ds).numpy().decode()
            new = sorted(set(os.listdir(dump_dir)) - seen)
            requests = {open(os.path.join(dump_dir, n), "rb").read() for n in new}
            if len(requests) != 1:
                raise SystemExit(f"{name}: expected one GetOrRegisterDataset request, got {new}")
            request = request_type.FromString(requests.pop())
            def_bytes = request.dataset.SerializeToString()
            if not only:
                with open(os.path.join(args.out, f"{name}.pb"), "wb") as f:
                    f.write(def_bytes)
            answer = disp.splits(dataset_id, name)
            print(f"{name}: {len(def_bytes)} bytes, "
                  f"{answer.get('refused') or answer['num_split_providers']}", file=sys.stderr)
            results.append({"name": name, "python": expr, "def": f"{name}.pb", **answer})
        for name, statements in GRAPH_SCENARIOS:
            if only and name not in only:
                continue
            definition = graph_mode_def(tf, cls, name, statements, data_dir)
            def_bytes = definition.SerializeToString()
            if not only:
                with open(os.path.join(args.out, f"{name}.pb"), "wb") as f:
                    f.write(def_bytes)
            reply = disp.call("GetOrRegisterDataset", request_type(dataset=definition),
                              "GetOrRegisterDatasetResponse")
            answer = disp.splits(reply.dataset_id, name)
            print(f"{name}: {len(def_bytes)} bytes, "
                  f"{answer.get('refused') or answer['num_split_providers']}", file=sys.stderr)
            # What MatchingFiles returns for each pattern in the graph, for the test's glob.
            globs = {}
            for node in definition.graph.node:
                if node.op == "Const" and any(
                        n.op == "MatchingFiles" and n.input[0] == node.name
                        for n in definition.graph.node):
                    for pattern in node.attr["value"].tensor.string_val:
                        found = tf.io.matching_files(pattern.decode()).numpy().tolist()
                        globs[pattern.decode()] = [f.decode() for f in found]
            results.append({"name": name, "python": "graph mode: " + statements,
                            "def": f"{name}.pb", **({"glob": globs} if globs else {}),
                            **answer})
        if not only:
            capture_globs(tf, args.out)
    finally:
        for p in (proxy, dispatcher):
            p.stdin.close()
            p.wait(timeout=30)
    if only:
        print(json.dumps(results, indent=1))
        return
    with open(os.path.join(args.out, "splits.json"), "w") as f:
        # One line per scenario: small, and a regenerated file diffs scenario by scenario.
        f.write('{"tf_version": %s, "max_splits": %d, "scenarios": [\n' % (
            json.dumps(tf.__version__), MAX_SPLITS))
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in results))
        f.write("\n]}\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "dispatcher":
        dispatcher_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "proxy":
        proxy_main(sys.argv[2], sys.argv[3])
    else:
        main()

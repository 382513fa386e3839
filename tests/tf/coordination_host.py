"""Task 0 of job `worker` for the coordination service conformance script
(`tests/src/tf_conformance.rs`), a real TensorFlow process.

--leader self: this process hosts TensorFlow's own coordination service, as MWMS's leader task
does, at --address. --leader HOST:PORT: the service is elsewhere (a coord replica or coord-proxy,
named `ps:0` in the cluster as an unmodified MWMS job names it), and this is a plain task.

Either way its agent registers, waits for all tasks (the script's tasks 1 and 2) and heartbeats,
as TensorFlow's agent does. It prints {"event": "ready"} once every task has come, and then lives
until it is killed.
"""
import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--address", required=True, help="this task's own host:port")
p.add_argument("--leader", required=True, help="'self', or the service's host:port")
p.add_argument("--tasks", type=int, default=3)
p.add_argument("--heartbeat-timeout-ms", type=int, default=30000)
args = p.parse_args()

import tensorflow as tf  # noqa: E402
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # noqa: E402
from tensorflow.core.protobuf import tensorflow_server_pb2  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

# The other tasks' addresses are never dialled by the script's tasks; TensorFlow's service only
# pushes errors to them (and fails to: nobody listens there).
others = [f"127.0.0.1:{1 + i}" for i in range(args.tasks - 1)]
jobs = {"worker": [args.address] + others}
if args.leader == "self":
    leader = "/job:worker/replica:0/task:0"
else:
    jobs["ps"] = [args.leader]
    leader = "/job:ps/replica:0/task:0"

ctx = context.context()
ctx.configure_coordination_service(
    service_type="standalone",
    service_leader=leader,
    heartbeat_timeout_in_ms=args.heartbeat_timeout_ms,
    coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=args.tasks)],
)
server_def = tensorflow_server_pb2.ServerDef(
    cluster=tf.train.ClusterSpec(jobs).as_cluster_def(),
    default_session_config=ctx.config,
    job_name="worker",
    task_index=0,
    protocol="grpc",
)
ctx.enable_collective_ops(server_def)
# Registers, and waits for every task.
ctx.ensure_initialized()
print(json.dumps({"event": "ready"}), flush=True)
while True:
    time.sleep(3600)

"""One unmodified TensorFlow MultiWorkerMirroredStrategy worker under a PreemptionCheckpointHandler.

As `mwms_worker.py`, TF_CONFIG lists the ensemble's address as `ps:0`, the coordination service
leader. The worker trains a variable by all-reduce, one step per `PreemptionCheckpointHandler.run`
call, until `--steps` calls have been made in all (counting those of earlier runs, restored from
the checkpoint). When any worker gets SIGTERM, TensorFlow's handler agrees on a step with the
others through the coordination service's keys (TERMINATED_WORKER, RUN_TO_CHECKPOINT,
RECEIVED_SIGNAL_*), every worker saves its checkpoint at that step and exits with code 42, which
is TensorFlow's own default outside Google Cloud. Every event is a JSON line on stdout.
"""
import os
import sys
import time

from mwms_common import configure, parser

p = parser(__doc__)
p.add_argument("--steps", type=int, required=True, help="run calls in all, over every run")
p.add_argument("--checkpoint-dir", required=True)
args = p.parse_args()
workers, say = configure(args)
# TensorFlow asks Google Cloud's metadata server whether it runs there (and waits up to 5 s for
# an answer): point it at a closed port so that it learns at once that it does not.
os.environ["GCE_METADATA_IP"] = "127.0.0.1:1"

import tensorflow as tf  # noqa: E402

say(event="imported")
strategy = tf.distribute.MultiWorkerMirroredStrategy()
say(event="strategy", replicas=strategy.num_replicas_in_sync)

with strategy.scope():
    # The sum of every step's all-reduce: the same on every worker, and restored with the step.
    total = tf.Variable(0.0, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
checkpoint = tf.train.Checkpoint(total=total)

handler = None


def checkpointed_and_exit():
    # TensorFlow calls this after the checkpoint of the agreed step is written.
    say(event="checkpointed", step=int(handler.total_run_calls), total=float(total.numpy()))
    sys.exit(42)


# TensorFlow's handler refuses a cluster with a `ps` job (it takes it for a
# ParameterServerStrategy cluster): it is given the worker job alone, which is all it uses (this
# task's id, the chief, the worker count). The coordination service it talks to is MWMS's.
workers_only = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec({"worker": workers}), task_type="worker", task_id=args.index
)
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    workers_only,
    checkpoint,
    args.checkpoint_dir,
    tf.distribute.experimental.TerminationConfig(exit_fn=checkpointed_and_exit),
)
say(event="resumed", step=int(handler.total_run_calls), total=float(total.numpy()))


@tf.function
def step():
    per_replica = strategy.run(lambda: tf.constant(float(args.index + 1)))
    s = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    total.assign_add(s)
    return s


while handler.total_run_calls < args.steps:
    s = handler.run(step)
    say(event="step", step=int(handler.total_run_calls), sum=float(s), total=float(total.numpy()))
    if args.step_sleep:
        time.sleep(args.step_sleep)
say(event="done", step=int(handler.total_run_calls), total=float(total.numpy()))

"""One unmodified TensorFlow MultiWorkerMirroredStrategy worker, pointed at a coord ensemble.

TF_CONFIG lists the ensemble's address (a replica, or a coord-proxy sidecar) as `ps:0`: with a
`ps` job in the cluster, MWMS makes ps:0 its coordination service leader by itself, and only the
`worker` tasks run. The worker exchanges keys, passes a barrier, then all-reduces every step;
every event is a JSON line on stdout.
"""
import sys
import time

from mwms_common import configure, parser

p = parser(__doc__)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--run", default="run", help="names this run's keys and barriers")
args = p.parse_args()
workers, say = configure(args)

import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

say(event="imported")
strategy = tf.distribute.MultiWorkerMirroredStrategy()
say(event="strategy", replicas=strategy.num_replicas_in_sync)

ctx = context.context()
ctx.set_config_key_value(f"{args.run}/worker{args.index}", f"hello from {args.index}")
peer = (args.index + 1) % len(workers)
value = ctx.get_config_key_value(f"{args.run}/worker{peer}")
say(event="kv", peer=peer, value=value)
ctx.wait_at_barrier(f"{args.run}/barrier", 60_000)
say(event="barrier")


@tf.function
def step(x):
    per_replica = strategy.run(lambda: tf.constant(x, tf.float32))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


try:
    for i in range(args.steps):
        total = step(float(args.index + 1))
        say(event="step", step=i, total=float(total))
        if args.step_sleep:
            time.sleep(args.step_sleep)
except tf.errors.OpError as e:
    # Another task failed: the coordination service told this task's agent, which aborted the
    # collectives.
    say(event="error", code=e.error_code, message=e.message)
    sys.exit(3)
# Coordination again after training (after any failover of the ensemble during it).
ctx.set_config_key_value(f"{args.run}/trained{args.index}", "yes")
ctx.get_config_key_value(f"{args.run}/trained{peer}")
ctx.wait_at_barrier(f"{args.run}/end", 60_000)
say(event="done")


"""What every MWMS worker script shares: its flags, its TF_CONFIG, and its event lines.

TF_CONFIG lists the ensemble's address (a replica, or a coord-proxy sidecar) as `ps:0`: with a
`ps` job in the cluster, MWMS makes ps:0 its coordination service leader by itself, and only the
`worker` tasks run. Every event is a JSON line on stdout, stamped with the worker, the seconds
since start and the wall-clock time.
"""
import argparse
import json
import os
import time


def parser(doc):
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--workers", required=True, help="every worker's host:port, comma-separated")
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--coordinator", required=True, help="host:port of a replica or a coord-proxy")
    p.add_argument("--step-sleep", type=float, default=0.0)
    return p


def configure(args):
    """Sets TF_CONFIG (before TensorFlow is imported); returns the workers and the event printer."""
    workers = args.workers.split(",")
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": workers, "ps": [args.coordinator]},
            "task": {"type": "worker", "index": args.index},
        }
    )
    started = time.monotonic()

    def say(**kv):
        kv["t"] = round(time.monotonic() - started, 3)
        kv["wall"] = time.time()
        kv["worker"] = args.index
        print(json.dumps(kv), flush=True)

    return workers, say

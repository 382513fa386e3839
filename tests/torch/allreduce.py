"""Plain init_process_group("gloo", init_method="env://") on a store that no rank hosts.

    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... TORCHELASTIC_USE_AGENT_STORE=True \
        python allreduce.py --steps N

With TORCHELASTIC_USE_AGENT_STORE=True, torch's env:// rendezvous makes every rank, rank 0
included, a client of the TCPStore at MASTER_ADDR:MASTER_PORT (without it rank 0 would try to
host one there). Every step all-reduces a tensor whose sum is known; every fifth step also makes a
new gloo group, whose ranks find each other through the store, and all-reduces over it. Rank 0
prints `step N` lines and, at the end, `result ok` or the first wrong sum; any rank exits 1 on a
wrong sum.
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--step-seconds", type=float, default=0.05)
args = p.parse_args()

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
every = world * (world + 1) // 2
for step in range(args.steps):
    t = torch.tensor([float((rank + 1) * (step + 1))])
    dist.all_reduce(t)
    want = float(every * (step + 1))
    if t.item() != want:
        print(f"result wrong: step {step} sum {t.item()} want {want}", flush=True)
        sys.exit(1)
    if step % 5 == 0:
        g = dist.new_group(list(range(world)))
        u = torch.tensor([1.0])
        dist.all_reduce(u, group=g)
        if u.item() != world:
            print(f"result wrong: step {step} group sum {u.item()} want {world}", flush=True)
            sys.exit(1)
        dist.destroy_process_group(g)
    if rank == 0:
        print(f"step {step} sum {t.item():.0f}", flush=True)
    time.sleep(args.step_seconds)
dist.barrier()
if rank == 0:
    print(f"result ok steps {args.steps} world {world}", flush=True)
dist.destroy_process_group()

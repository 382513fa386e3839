"""A small data-parallel training job for torchrun (gloo, CPU): a linear model fitted to fixed
data with DistributedDataParallel, one line per step from rank 0, and the final weights' digest.

    torchrun ... train.py --steps N [--step-seconds S]

Everything is seeded, so a run's result depends only on N: a leader change of the store under
torchrun must leave it unchanged.
"""

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--step-seconds", type=float, default=0.05)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1234)
x = torch.randn(512, 16, generator=g)
y = x @ torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16.0 + 0.5
shard = slice(rank * 512 // world, (rank + 1) * 512 // world)
for step in range(args.steps):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    time.sleep(args.step_seconds)
dist.barrier()
if rank == 0:
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
    print(f"result {digest.hexdigest()} restarts {os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"world {world}", flush=True)
dist.destroy_process_group()

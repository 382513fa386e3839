"""A torch TCPStore client calling ADD back to back, for coord-bench torch's leader kills.

    python store_stall.py HOST PORT

One connection for its whole life, as torch's client has (it never reconnects). Prints `ready`
once connected, then a JSON line `{"gap": seconds}` for every call that took over 50 ms.
"""

import datetime
import json
import sys
import time

import torch.distributed as dist

store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                      timeout=datetime.timedelta(seconds=120))
print("ready", flush=True)
last = time.monotonic()
while True:
    store.add("stall", 1)
    now = time.monotonic()
    if now - last > 0.05:
        print(json.dumps({"gap": now - last}), flush=True)
    last = now

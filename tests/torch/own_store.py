"""torch's own TCPStore server (libuv, torch's default), standing alone, for coord-bench torch.

    python own_store.py PORT

Prints `ready` once it listens on 127.0.0.1:PORT and serves until killed.
"""

import datetime
import sys
import time

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, use_libuv=True,
                      wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
print("ready", flush=True)
while True:
    time.sleep(3600)

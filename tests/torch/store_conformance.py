"""One script of TCPStore calls, run against torch's own server and against coord-proxy's.

    store_conformance.py HOST PORT [--own-server]

With --own-server it first starts torch's own TCPStore server (libuv) on PORT. Every call's
outcome is printed as one JSON line {"step", "outcome"}; the test compares the two runs line by
line. Outcomes are values (bytes as latin-1 text), or the exception's type and whether its message
says "timeout", never timings or addresses.
"""

import hashlib
import json
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
own = "--own-server" in sys.argv[3:]
TIMEOUT = timedelta(seconds=60)

server = None
if own:
    server = dist.TCPStore(host, port, is_master=True, use_libuv=True, wait_for_workers=False,
                           timeout=TIMEOUT)


def client():
    return dist.TCPStore(host, port, is_master=False, timeout=TIMEOUT, wait_for_workers=False)


def show(v):
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if isinstance(v, (list, tuple)):
        return [show(x) for x in v]
    return v


def step(name, fn):
    try:
        outcome = {"ok": show(fn())}
    except Exception as e:  # the outcome is the error's kind
        outcome = {"error": type(e).__name__, "timeout": "timeout" in str(e).lower()}
    print(json.dumps({"step": name, "outcome": outcome}), flush=True)


def later(delay, fn):
    """Runs fn on its own connection after delay seconds (a second client releasing the first)."""
    def run():
        time.sleep(delay)
        fn(client())
    t = threading.Thread(target=run)
    t.start()
    return t


a = client()
b = client()

step("set/get", lambda: (a.set("x", "1"), a.get("x"))[1])
step("slashes are kept: /x", lambda: (a.set("/x", "2"), a.get("/x"))[1])
step("slashes are kept: //x", lambda: (a.set("//x", "3"), b.get("//x"), b.get("x"))[1:])
# A reply-less write (SET, APPEND, QUEUE_PUSH) is ordered before a later request of the same
# connection; one of another connection sees it once the writer has had an answer since (torch's
# server, one thread, usually gets the bytes in sending order; coord-proxy's connections run side
# by side, so the script only races them where the order does not matter).
step("overwrite", lambda: (a.set("x", "one"), a.check(["x"]), b.get("x"))[2])
step("add", lambda: [a.add("n", 5), b.add("n", -2), a.add("n", 0)])
step("add stores decimal", lambda: a.get("n"))
step("compare_set missing, non-empty expected (quirk)", lambda: a.compare_set("cas0", "x", "y"))
step("... and the key stays missing", lambda: a.check(["cas0"]))
step("compare_set missing, empty expected", lambda: a.compare_set("cas", "", "v1"))
step("compare_set mismatch", lambda: b.compare_set("cas", "nope", "v2"))
step("compare_set match", lambda: b.compare_set("cas", "v1", "v2"))
step("compare_set result stored", lambda: a.get("cas"))
step("append", lambda: (a.append("ap", "ab"), a.check(["ap"]), b.append("ap", "cd"), b.check(["ap"]),
                        a.get("ap"))[4])
step("delete_key", lambda: [a.delete_key("ap"), a.delete_key("ap")])
step("check", lambda: [a.check(["x", "n"]), a.check(["x", "missing"]), a.check([])])
step("multi_set/multi_get", lambda: (a.multi_set(["m1", "m2", "m3"], ["a", "", "c"]),
                                     b.multi_get(["m1", "m2", "m3"]))[1])
step("wait for present keys", lambda: a.wait(["x", "m2"], timedelta(seconds=10)))
step("wait times out", lambda: a.wait(["never"], timedelta(milliseconds=300)))
step("usable after a cancelled wait", lambda: (a.set("after", "ok"), a.get("after"))[1])
step("get times out", lambda: (a.set_timeout(timedelta(milliseconds=300)), a.get("never"))[1])
a.set_timeout(TIMEOUT)
t = later(0.3, lambda c: c.set("late", "here"))
step("wait released by a second client", lambda: (b.wait(["late"]), b.get("late"))[1])
t.join()
t = later(0.3, lambda c: c.add("late_n", 7))
step("blocking get released by a second client", lambda: a.get("late_n"))
t.join()
step("queue push/len", lambda: (a.queue_push("q", "1"), a.queue_push("q", b"2"), a.queue_len("q"))[2])
step("a non-empty queue satisfies wait/check", lambda: (a.wait(["q"]), a.check(["q"]))[1])
step("queues are not keys", lambda: a.check(["q_none"]))
step("queue pop in order", lambda: [a.queue_pop("q"), b.queue_pop("q", block=False), a.queue_len("q")])
step("non-blocking pop of an empty queue", lambda: a.queue_pop("q", block=False))
t = later(0.3, lambda c: c.queue_push("q2", "pushed"))
step("blocking pop released by a push", lambda: b.queue_pop("q2"))
t.join()
step("blocking pop times out", lambda: (b.set_timeout(timedelta(milliseconds=300)), b.queue_pop("q3"))[1])
b.set_timeout(TIMEOUT)
t = later(0.3, lambda c: c.barrier("bar", 2, TIMEOUT))
step("barrier released by the second arrival", lambda: a.barrier("bar", 2, TIMEOUT))
t.join()
step("barrier counter", lambda: a.get("bar"))
step("barrier times out", lambda: a.barrier("bar1", 2, timedelta(milliseconds=300)))
step("usable after a cancelled barrier", lambda: a.add("after_barrier", 1))
big = bytes((i * 7 + i // 251) % 256 for i in range(4 << 20))
step("4 MiB value", lambda: (a.set("big", big), hashlib.sha256(b.get("big")).hexdigest(), len(b.get("big")))[1:])
step("list_keys", lambda: sorted(a.list_keys()))
step("num_keys", lambda: a.num_keys())
step("delete then num_keys", lambda: [b.delete_key("big"), a.num_keys()])
print(json.dumps({"step": "done"}), flush=True)

"""A queue consumer process for the multi-process tests: claim, record, complete.

Each claimed item's name is appended to the output file and fsynced BEFORE the item
is completed, as the real consumer does with its records; so the union of outputs
must cover every item even when a worker is SIGKILLed.
usage: python -m tests.queue_worker HOSTS ROOT ID OUT [SESSION_TIMEOUT]
"""

from __future__ import annotations

import os
import sys
import threading

from zkcrawl.queue.leases import LeaseQueue, QueueSuspended
from zkcrawl.zk.client import ZkClient


def main() -> None:
    hosts, root, wid, out = sys.argv[1:5]
    session_timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 10.0
    zk = ZkClient(hosts, zk_timeout=30, session_timeout=session_timeout).connect()
    q = LeaseQueue(zk, root, wid)
    zk.create(f"{root}/consumers/{wid}", b"{}", ephemeral=True, makepath=True)
    go = threading.Event()
    if zk.exists(f"{root}/go", watch=lambda _e: go.set()):
        go.set()
    go.wait(60)
    with open(out, "a") as fh:
        while True:
            got = q.claim(25, timeout=1.0)
            if not got:
                try:
                    if q.depth() == 0:
                        break
                except Exception:  # a server is down: try again
                    pass
                continue
            fh.write("".join(f"{c.name} {c.url}\n" for c in got))
            fh.flush()
            os.fsync(fh.fileno())
            while True:
                try:
                    q.complete(got)
                    break
                except QueueSuspended:
                    q.wait_connected(30)
    zk.close()


if __name__ == "__main__":
    main()

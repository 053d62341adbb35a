"""A store writer run as a real child process by the crash tests.

Modes:
  write       open the store, then N producers (asyncio tasks) put at full speed.
              Prints one line per acknowledgement, flushed at once, so the parent
              knows exactly what was acknowledged when it kills this process:
                  READY <pid>
                  OK <msg id> <offset> <size>      a put returned PUT_OK
                  FAIL <msg id> <status>           a put returned anything else
                  FLUSHED <offset>                 `flushed` reached offset (--report-flushed)
                  CLOSED <wrote>                   SIGTERM: clean close finished
                  DONE <wrote>                     every producer finished (also closed)
              Message ids are p<producer>-<seq>; each producer awaits each put before
              the next, so its own ids reach the log in sequence order.
  open        open the store (running recovery) and close it; prints the recovery
              summary. With --failpoints a failpoint can kill it mid-recovery.

--fsize-limit N sets RLIMIT_FSIZE (SIGXFSZ ignored), so any write past byte N of a
file fails with EFBIG: a real write error, no fake IO.

Bounded: every producer stops after --per-producer puts, and the process after
--max-seconds, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import signal
import sys

from store.config import TESTING, CorruptionPolicy, CrashModel, FlushMode
from store.failpoints import Failpoints
from store.log.record import UNIQ_KEY, Message
from store.status import PutStatus
from store.store import MessageStore


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["write", "open"])
    p.add_argument("--dir", required=True)
    p.add_argument("--flush", default="SYNC_FLUSH", choices=[m.value for m in FlushMode])
    p.add_argument("--crash-model", default="power", choices=[m.value for m in CrashModel])
    p.add_argument("--flush-interval-ms", type=int, default=TESTING.flush_interval_ms)
    p.add_argument("--producers", type=int, default=16)
    p.add_argument("--per-producer", type=int, default=2000)
    p.add_argument("--body-min", type=int, default=16)
    p.add_argument("--body-max", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--report-flushed", action="store_true")
    p.add_argument("--failpoints", default="")
    p.add_argument("--fsize-limit", type=int, default=0)
    p.add_argument("--corruption-policy", default=CorruptionPolicy.REFUSE.value,
                   choices=[m.value for m in CorruptionPolicy])
    p.add_argument("--repair-from-dir", default=None,
                   help="repair from this store directory (a replica's files)")
    return p.parse_args()


async def write(args: argparse.Namespace, store: MessageStore) -> None:
    await store.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def producer(p: int) -> None:
        rng = random.Random(args.seed * 1000 + p)
        for seq in range(args.per_producer):
            msg_id = f"p{p:02d}-{seq:06d}"
            body = rng.randbytes(rng.randint(args.body_min, args.body_max))
            r = await store.put(Message("crash", body, {UNIQ_KEY: msg_id}, queue_id=p % 4))
            if r.status is PutStatus.PUT_OK:
                out(f"OK {msg_id} {r.offset} {r.size}")
            else:
                out(f"FAIL {msg_id} {r.status.value}")
                return

    async def report_flushed() -> None:
        last = -1
        while True:
            flushed = store.log.flushed
            if flushed != last:
                out(f"FLUSHED {flushed}")
                last = flushed
            await asyncio.sleep(0.002)

    tasks = [loop.create_task(producer(p)) for p in range(args.producers)]
    watcher = loop.create_task(report_flushed()) if args.report_flushed else None
    async def all_done() -> None:
        await asyncio.gather(*tasks, return_exceptions=True)

    async def stopped() -> None:
        await stop.wait()

    stopper = loop.create_task(stopped())
    done_all = loop.create_task(all_done())
    await asyncio.wait([stopper, done_all], timeout=args.max_seconds,
                       return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if watcher is not None:
        watcher.cancel()
    stopper.cancel()
    done_all.cancel()
    await store.close()
    out(f"{'CLOSED' if stop.is_set() else 'DONE'} {store.log.wrote}")


def main() -> int:
    args = parse()
    if args.fsize_limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, args.fsize_limit))
    config = TESTING.with_(
        flush_mode=FlushMode(args.flush),
        crash_model=CrashModel(args.crash_model),
        flush_interval_ms=args.flush_interval_ms,
        corruption_policy=CorruptionPolicy(args.corruption_policy),
    )
    source = None
    if args.repair_from_dir:
        # A sibling module: this file runs as a script from tests/support/.
        from store_helpers import replica_files_source  # type: ignore[import-not-found]

        source = replica_files_source(args.repair_from_dir)
    store = MessageStore.open(args.dir, config, failpoints=Failpoints(args.failpoints),
                              repair_source=source)
    out(f"READY {os.getpid()}")
    if args.mode == "open":
        out(f"RECOVERED {store.log.recovery.summary}")
        store.close_sync()
        return 0
    asyncio.run(write(args, store))
    return 0


if __name__ == "__main__":
    sys.exit(main())

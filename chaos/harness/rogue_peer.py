"""A rogue HA peer: a replication stream that reports an offset beyond the
master's end (the fault behind apache/rocketmq#3015).

In RocketMQ any TCP connection to the HA port could do it (the issue's
reproduction writes arbitrary bytes into one). Here the HA stream needs the
cluster token, so the rogue is an insider: a misconfigured or buggy peer
holding the cluster's credentials. It names itself (not a connected slave,
whose name the master would refuse from another process), opens a stream
with a first report equal to the master's end as the harness read it (a
legitimate report: the master ships from there), then reports that end plus
`over_by` bytes, and repeats that report every heartbeat interval so the
stream stays alive. It reads and drops whatever the master ships. The
fixed master closes the stream at the over-report (#3016); under
`--emulate rmq-3015` it believes it.

    python -m chaos.harness.rogue_peer --address HOST:PORT --token-file FILE
        --first-offset N [--over-by BYTES] [--name NAME]

It runs until the master ends the stream (or it is killed) and says on
stderr what happened; exit 0 when the stream was opened at all.
`RoguePeerProcess` is the harness side; `RoguePeerTask` the sim's (the same
`run`, as a task on the sim's loop over its in-memory network).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable

import grpc

from ha.transport.grpc_transport import GrpcConnector
from ha.transport.streams import EOF, HAConnector
from proto import ha_pb2

NAME = "rogue-peer"
OVER_BY = 1 << 30  # the "arbitrary bytes" made a huge offset; 1 GiB here
REPORT_INTERVAL_S = 1.0  # a slave's heartbeat report interval


def _say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} rogue peer: {text}", file=sys.stderr, flush=True)


async def run(connector: HAConnector, address: str, token: str, *, first_offset: int,
              over_by: int = OVER_BY, name: str = NAME,
              interval_s: float = REPORT_INTERVAL_S, incarnation: str | None = None,
              say: Callable[[str], None] = _say) -> str:
    """Open the stream, report `first_offset`, then `first_offset + over_by`
    every `interval_s` until the master ends the stream. Returns how it
    ended. (The sim passes its own incarnation and `say`: nothing random
    or wall-clock in its run directory.)"""
    incarnation = incarnation or secrets.token_hex(8)
    async with connector.open(address, token) as call:
        await call.write(ha_pb2.Report(max_offset=first_offset, slave=name,
                                       incarnation=incarnation))
        say(f"stream opened, first report {first_offset}")

        async def drain() -> None:
            while (await call.read()) is not EOF:
                pass

        reader = asyncio.create_task(drain())
        try:
            over = first_offset + over_by
            while not reader.done():
                await call.write(ha_pb2.Report(max_offset=over, slave=name,
                                               incarnation=incarnation))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reader), interval_s)
            with contextlib.suppress(Exception):
                reader.result()
            code = await call.code()
            details = await call.details()
            return f"the master ended the stream: {code.name} {details}"
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.harness.rogue_peer")
    p.add_argument("--address", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--first-offset", type=int, required=True)
    p.add_argument("--over-by", type=int, default=OVER_BY)
    p.add_argument("--name", default=NAME)
    args = p.parse_args(argv)
    from cluster.node.auth import read_token_file

    token = read_token_file(args.token_file)
    try:
        ended = asyncio.run(run(GrpcConnector(), args.address, token,
                                first_offset=args.first_offset, over_by=args.over_by,
                                name=args.name))
    except grpc.aio.AioRpcError as exc:  # the usual end: the master closed or died
        _say(f"the stream ended: {exc.code().name} {exc.details()}")
        return 0
    except Exception as exc:  # the stream failed: say how, as a peer would log it
        _say(f"stream failed: {type(exc).__name__}: {exc}")
        return 1
    _say(ended)
    return 0


# ------------------------------------------------------------------ harness
class RoguePeerProcess:
    """Starts the rogue peer as its own process; `stop` ends it."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, address: str, token_file: str, first_offset: int) -> None:
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        args = [sys.executable, "-m", "chaos.harness.rogue_peer", "--address", address,
                "--token-file", token_file, "--first-offset", str(first_offset)]
        with open(self.log_path, "ab") as err:  # the child holds it; ours closes at once
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=err)

    def stop(self) -> int | None:
        """End it if it still runs; its exit code (None: it never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        return self._proc.returncode


class RoguePeerTask:
    """The sim backend's rogue peer (chaos/sim/run.py): `run` as a task on the
    running loop, over the sim's in-memory network (ha/transport/'s
    MemoryConnector). `lines` is its log, each line stamped by `now_ms`."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self.lines: list[str] = []
        self._now_ms = now_ms
        self._task: asyncio.Task[None] | None = None

    def _say(self, text: str) -> None:
        self.lines.append(f"{self._now_ms()} rogue peer: {text}")

    def start(self, connector: HAConnector, address: str, token: str, first_offset: int,
              incarnation: str) -> None:
        async def main() -> None:
            try:
                self._say(await run(connector, address, token, first_offset=first_offset,
                                    incarnation=incarnation, say=self._say))
            except asyncio.CancelledError:
                self._say("stopped")
                raise
            except grpc.aio.AioRpcError as exc:  # the usual end: the master closed or died
                self._say(f"the stream ended: {exc.code().name} {exc.details()}")
            except Exception as exc:  # the stream failed: say how, as main() does
                self._say(f"stream failed: {type(exc).__name__}: {exc}")

        self._task = asyncio.get_running_loop().create_task(main())

    def stop(self) -> bool:
        """End it if it still runs; whether it was ever started."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        return self._task is not None


if __name__ == "__main__":
    sys.exit(main())

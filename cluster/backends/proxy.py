"""A TCP proxy for one replication link (slave -> master) that the local
backend can cut and heal, so a partition is a real network fault on real
sockets.

    python -m cluster.backends.proxy --listen 127.0.0.1:PORT --target 127.0.0.1:PORT \
        [--state-file FILE]

Runs until SIGTERM. Signals drive it:
- SIGUSR1 cuts the link like a dropped network: bytes in both directions are
  silently discarded and new connections are accepted and held but go
  nowhere. Neither peer gets a reset; each notices only by its own timeouts
  (HA housekeeping), as with a real partition or `docker network disconnect`.
- SIGUSR2 heals it: every connection that lived through the cut is closed
  (its streams lost bytes, so it cannot be resumed) and new connections are
  forwarded again.
The state file (JSON: listen, target, cut, pid, connections) is rewritten on
every change, so other processes can see whether the link is cut.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys


class _Conn:
    __slots__ = ("client", "upstream", "tainted")

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tainted = False

    def abort(self) -> None:
        for w in (self.client, self.upstream):
            if w is not None:
                w.transport.abort()


class LinkProxy:
    def __init__(self, target: tuple[str, int], state_file: str | None, listen: str) -> None:
        self.target = target
        self.state_file = state_file
        self.listen = listen
        self.cut = False
        self.conns: set[_Conn] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        self.conns.add(conn)
        try:
            if self.cut:
                conn.tainted = True
                await _discard(reader)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return  # the target is down: the peer sees the connection close
            conn.upstream = up_writer
            pipes = [asyncio.create_task(self._pipe(reader, up_writer, conn)),
                     asyncio.create_task(self._pipe(up_reader, writer, conn))]
            _, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
        finally:
            self.conns.discard(conn)
            conn.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    conn: _Conn) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await src.read(256 * 1024)
                if not data:
                    if conn.tainted:
                        # Behind a cut nobody sees the other side close:
                        # hold the connection until heal aborts it.
                        await asyncio.Event().wait()
                    return
                if self.cut or conn.tainted:
                    conn.tainted = True
                    continue  # the network eats it
                dst.write(data)
                await dst.drain()

    def do_cut(self) -> None:
        self.cut = True
        for c in self.conns:
            c.tainted = True
        self.write_state()

    def do_heal(self) -> None:
        self.cut = False
        for c in [c for c in self.conns if c.tainted]:
            c.abort()
        self.write_state()

    def write_state(self) -> None:
        if not self.state_file:
            return
        state = {"listen": self.listen, "target": f"{self.target[0]}:{self.target[1]}",
                 "cut": self.cut, "pid": os.getpid(), "connections": len(self.conns)}
        tmp = self.state_file + ".tmp"
        # O_NOFOLLOW: never write through a link in the cluster directory
        # (cluster/backends/dir_files.py).
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644),
                  "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state_file)


async def _discard(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(OSError):
        while await reader.read(256 * 1024):
            pass


def _addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


async def run(listen: tuple[str, int], target: tuple[str, int], state_file: str | None,
              start_cut: bool) -> int:
    proxy = LinkProxy(target, state_file, f"{listen[0]}:{listen[1]}")
    try:
        server = await asyncio.start_server(proxy.handle, listen[0], listen[1])
    except OSError as exc:
        print(f"proxy: cannot listen on {listen[0]}:{listen[1]}: {exc.strerror}",
              file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, proxy.do_cut)
    loop.add_signal_handler(signal.SIGUSR2, proxy.do_heal)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if start_cut:
        proxy.do_cut()
    proxy.write_state()
    async with server:
        await stop.wait()
    for c in list(proxy.conns):
        c.abort()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.backends.proxy",
                                     description="cuttable TCP proxy for one replication link")
    parser.add_argument("--listen", type=_addr, required=True)
    parser.add_argument("--target", type=_addr, required=True)
    parser.add_argument("--state-file")
    parser.add_argument("--cut", action="store_true", help="start with the link cut")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.listen, args.target, args.state_file, args.cut))


if __name__ == "__main__":
    sys.exit(main())

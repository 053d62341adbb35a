"""The chaos run's consumer: a pull consumer (cluster.client.consumer.Consumer) as
its own OS process, so a scenario can SIGKILL it like a node and start it
again (a new incarnation, resuming from the offsets the broker kept for its
group).

What the child writes, to RUN_DIR/consumer/N.jsonl (N = incarnation), one
JSON object a line, each line one os.write on an O_APPEND descriptor (no
user-space buffer, so a SIGKILL never loses or cuts a line the process had
written):
- {"kind": "delivery", ...}: written by the handler, that is BEFORE the
  consumer's in-memory offset moves past the message (at-least-once): a
  killed consumer has recorded every message it was handed;
- {"kind": "commit", queue_id, offset, ...}: after the broker accepted a
  commit of that queue's offset;
- {"kind": "end", ...}: once, after a clean drain: the offsets it ended at
  and each node's max queue offsets then.

Draining: the harness creates RUN_DIR/consumer/drain (a file, not a signal:
a signal could reach the child before Python has installed a handler). The
child then consumes until no message came for `quiet_ms` after it saw the
file, commits, writes its end row and exits 0. A clean stop (a scenario's
`stop` of the consumer) is the same through RUN_DIR/consumer/N.stop, at
once instead of when idle.

`ConsumerProcess` is the harness side; `collect` turns the incarnations'
files into the run's consumed.jsonl, committed.jsonl and consumer.json rows
(chaos/schema.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GROUP = "chaos"
# RocketMQ's persistConsumerOffsetInterval: a consumer killed inside it
# receives again what it consumed since its last commit.
COMMIT_INTERVAL_MS = 5_000
# After the drain file appears, the consumer stops once this long passed
# without a delivery (its idle poll is 50 ms: many empty pulls of every
# queue). Seconds, not a fraction: on a loaded machine a restarted master's
# answers can pause that long while messages are still there to consume.
DRAIN_QUIET_MS = 2_000
DRAIN_FILE = "drain"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# ------------------------------------------------------------------ harness
class ConsumerProcess:
    """Starts, kills and drains the consumer child of one run."""

    def __init__(self, run_dir: str, *, targets: Mapping[str, str], token_file: str,
                 topic: str, commit_interval_ms: int = COMMIT_INTERVAL_MS) -> None:
        assert targets, "the consumer needs the master's address (first) and the slaves'"
        self.dir = os.path.join(run_dir, "consumer")
        self.targets = dict(targets)  # node name -> address, master first
        self.token_file = token_file
        self.topic = topic
        self.commit_interval_ms = commit_interval_ms
        self.incarnations = 0
        self.drain_started_ms: int | None = None
        self.drained = False  # the last incarnation ended by the drain protocol
        self._procs: list[subprocess.Popen[bytes]] = []  # one per incarnation

    @property
    def _proc(self) -> subprocess.Popen[bytes] | None:
        return self._procs[-1] if self._procs else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        assert not self.running
        os.makedirs(self.dir, exist_ok=True)
        self.incarnations += 1
        base = os.path.join(self.dir, str(self.incarnations))
        args = [sys.executable, "-m", "chaos.harness.consumer_proc", "--out", base + ".jsonl",
                "--drain-file", os.path.join(self.dir, DRAIN_FILE), "--stop-file",
                base + ".stop",
                "--token-file", self.token_file, "--group", GROUP, "--topic", self.topic,
                "--commit-interval-ms", str(self.commit_interval_ms)]
        for name, address in self.targets.items():
            args += ["--target", f"{name}={address}"]
        with open(base + ".log", "wb") as err:  # the child holds it; ours closes at once
            self._procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=err))

    def has_written(self, kind: str) -> bool:
        """Whether the running incarnation has written a row of `kind`
        ("delivery": it was handed a message; "commit": a commit was accepted)."""
        path = os.path.join(self.dir, f"{self.incarnations}.jsonl")
        marker = f'"kind": "{kind}"'.encode()
        try:
            with open(path, "rb") as f:
                return any(marker in line for line in f)
        except FileNotFoundError:
            return False

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def stop(self, *, timeout_s: float = 10.0) -> bool:
        """Stop the running incarnation cleanly (it commits its offsets on
        the way out, as a consumer shut down or rebalanced does); SIGKILL it
        if it has not stopped within `timeout_s`. Returns whether it
        stopped cleanly (False too when it had already exited)."""
        if self._proc is None or not self.running:
            return False
        with open(os.path.join(self.dir, f"{self.incarnations}.stop"), "w"):
            pass
        try:
            return self._proc.wait(timeout=timeout_s) == 0
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def drain(self, *, timeout_s: float = 20.0) -> None:
        """Let the running incarnation consume what the cluster holds and
        stop cleanly; SIGKILL it if it has not within `timeout_s` (then
        `drained` stays False and the run's stored-never-delivered figure is
        unknown)."""
        assert self._proc is not None
        self.drain_started_ms = _now_ms()
        with open(os.path.join(self.dir, DRAIN_FILE), "w"):
            pass
        try:
            self.drained = self._proc.wait(timeout=timeout_s) == 0
        except subprocess.TimeoutExpired:
            self.kill()

    def collect(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        return collect(self.dir, self.incarnations, group=GROUP, topic=self.topic,
                       commit_interval_ms=self.commit_interval_ms,
                       drain_started_ms=self.drain_started_ms, drained=self.drained,
                       exit_codes=[p.poll() for p in self._procs])


def collect(directory: str, incarnations: int, *, group: str, topic: str,
            commit_interval_ms: int, drain_started_ms: int | None, drained: bool,
            exit_codes: list[int | None]
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(consumed rows, committed rows, consumer.json) from the incarnations'
    files, each row tagged with its incarnation."""
    consumed: list[dict[str, Any]] = []
    committed: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    for n in range(1, incarnations + 1):
        path = os.path.join(directory, f"{n}.jsonl")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    # os.write of one line is not cut by SIGKILL; a bad line
                    # would be a bug, and dropping it must not hide one.
                    raise ValueError(f"{path}: not a JSON line: {line!r}") from None
                kind = row.pop("kind")
                row["incarnation"] = n
                if kind == "delivery":
                    consumed.append(row)
                elif kind == "commit":
                    committed.append(row)
                elif kind == "end" and n == incarnations:
                    end = row
    summary = {
        "group": group, "topic": topic, "commit_interval_ms": commit_interval_ms,
        "incarnations": incarnations, "exit_codes": exit_codes,
        "drain_started_ms": drain_started_ms,
        "drained": drained and end is not None,
        "ended_ms": None if end is None else end["time_ms"],
        "end_offsets": None if end is None else end["offsets"],
        "max_offsets": None if end is None else end["max_offsets"],
    }
    return consumed, committed, summary


# -------------------------------------------------------------------- child
@dataclass
class _Drain:
    """The child's drain decision, a pure function of times."""

    quiet_ms: int
    seen_ms: int | None = None  # when the drain file was first seen
    last_delivery_ms: int = 0

    def should_stop(self, now_ms: int, requested: bool, *, at_once: bool = False) -> bool:
        if at_once:
            return True
        if requested and self.seen_ms is None:
            self.seen_ms = now_ms
        if self.seen_ms is None:
            return False
        return now_ms - max(self.seen_ms, self.last_delivery_ms) >= self.quiet_ms


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos.harness.consumer_proc",
                                description="The chaos harness's consumer process.")
    p.add_argument("--out", required=True)
    p.add_argument("--drain-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--commit-interval-ms", type=int, default=COMMIT_INTERVAL_MS)
    p.add_argument("--quiet-ms", type=int, default=DRAIN_QUIET_MS)
    p.add_argument("--target", action="append", required=True, help="NAME=HOST:PORT")
    return p.parse_args(argv)


async def _child(args: argparse.Namespace) -> int:
    import grpc

    from cluster.client.consumer import Consumer, Delivery
    from cluster.node.auth import read_token_file
    from ha.credentials import token_metadata
    from proto import broker_pb2, broker_pb2_grpc

    names = dict(t.split("=", 1) for t in args.target)  # name -> address
    by_address = {a: n for n, a in names.items()}
    token = read_token_file(args.token_file)
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(row: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(row, sort_keys=True) + "\n").encode())

    drain = _Drain(args.quiet_ms)

    class Recording(Consumer):
        """Records each commit the broker took whole: the offsets as they
        were when it was sent (the consumer does not move them during one).
        A commit that fails part way is not recorded (its first queues may
        have reached the broker)."""

        async def commit(self) -> None:
            offsets = dict(self.offsets)
            before = self.commits
            await super().commit()
            if self.commits != before:
                t = _now_ms()
                for q, o in sorted(offsets.items()):
                    emit({"kind": "commit", "topic": self.topic, "queue_id": q, "offset": o,
                          "time_ms": t})

    def handle(d: Delivery) -> None:
        # Recorded before the handler returns, so before the offset moves.
        emit({"kind": "delivery", "msg_id": d.msg_id, "topic": d.topic,
              "queue_id": d.queue_id, "queue_offset": d.queue_offset,
              "commitlog_offset": d.commitlog_offset, "node": by_address.get(d.node, d.node),
              "node_role": d.node_role, "time_ms": d.time_ms})
        drain.last_delivery_ms = _now_ms()

    stop = asyncio.Event()

    async def watch() -> None:
        while not drain.should_stop(_now_ms(), os.path.exists(args.drain_file),
                                    at_once=os.path.exists(args.stop_file)):
            await asyncio.sleep(0.05)
        stop.set()

    async with Recording(list(names.values()), token=token, group=args.group,
                         topic=args.topic, commit_interval_ms=args.commit_interval_ms) as c:
        watcher = asyncio.create_task(watch())
        try:
            await c.run(handle, stop=stop)  # commits once more on the way out
        finally:
            watcher.cancel()
        max_offsets: dict[str, dict[str, int]] = {}
        for name, address in names.items():
            async with grpc.aio.insecure_channel(address) as ch:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    resp = await broker_pb2_grpc.BrokerStub(ch).QueueInfo(
                        broker_pb2.QueueInfoRequest(topic=args.topic), timeout=5.0,
                        metadata=token_metadata(token))
                    max_offsets[name] = {str(q.queue_id): q.max_offset for q in resp.queues}
        emit({"kind": "end", "time_ms": _now_ms(),
              "offsets": {str(q): o for q, o in sorted(c.offsets.items())},
              "max_offsets": max_offsets})
    os.close(fd)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    return asyncio.run(_child(args))


if __name__ == "__main__":
    sys.exit(main())

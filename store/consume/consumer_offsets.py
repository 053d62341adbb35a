"""The broker's consumer offset table (RocketMQ's ConsumerOffsetManager):
`topic@group` -> {queue id: the next queue offset the group will consume}.

Consumers commit offsets to the broker in memory; the broker persists the
table periodically (5 s, RocketMQ's flushConsumerOffsetInterval) and at a
clean shutdown — never on a crash. Offsets committed after the last persist
are lost by a broker crash, and the group consumes those messages again:
that is where much duplicate consumption comes from (reference 004).

Persisting is atomic: write `consumerOffset.json.tmp`, fsync it, keep the
previous file as `.bak`, rename the new one over it, fsync the directory. A
file that does not parse is reported by name with the fix, and the `.bak`
is used instead (as RocketMQ's ConfigManager.load does).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from store.seams.disk import Disk, RealDisk

FILE_NAME = "consumerOffset.json"
log = logging.getLogger("dlab.store.offsets")


class OffsetTableError(RuntimeError):
    """Neither the offset file nor its backup could be read."""


def _key(group: str, topic: str) -> str:
    return f"{topic}@{group}"


def _parse(text: str) -> dict[str, dict[int, int]]:
    doc = json.loads(text)
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise ValueError("no offsetTable object")
    out: dict[str, dict[int, int]] = {}
    for key, queues in table.items():
        if not isinstance(key, str) or "@" not in key or not isinstance(queues, dict):
            raise ValueError(f"bad entry {key!r}")
        out[key] = {int(q): int(o) for q, o in queues.items()}
    return out


class ConsumerOffsetTable:
    def __init__(self, directory: str, *, before_rename: Callable[[], None] | None = None,
                 disk: Disk | None = None) -> None:
        self.directory = directory
        self.disk = disk or RealDisk()
        self.path = os.path.join(directory, FILE_NAME)
        self._table: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()  # the table
        # One persist at a time: the store's service and a slave's sync both
        # persist, and two writers of one temp file would rename a mix.
        self._persist_lock = threading.Lock()
        self._changes = 0  # commits since the table was created
        self._persisted = 0  # of them, how many the file holds
        self._before_rename = before_rename  # a failpoint's hook
        self.note: str | None = None

    @property
    def dirty(self) -> bool:
        """Whether commits were made since the last successful persist."""
        return self._changes != self._persisted

    @classmethod
    def load(cls, directory: str, *, before_rename: Callable[[], None] | None = None,
             disk: Disk | None = None) -> ConsumerOffsetTable:
        t = cls(directory, before_rename=before_rename, disk=disk)
        problems = []
        for path in (t.path, t.path + ".bak"):
            try:
                raw = t.disk.read_file(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror or exc}")
                continue
            try:
                t._table = _parse(raw.decode("utf-8"))  # not UTF-8: a ValueError too
            except (ValueError, TypeError) as exc:
                problems.append(f"{path} is not a consumer offset table ({exc})")
                continue
            if problems:
                t.note = "; ".join(problems) + f"; loaded {path} instead"
                log.warning("%s", t.note)
            return t
        if problems:
            raise OffsetTableError(
                "; ".join(problems) + ". Fix or remove the file(s) to start with an empty "
                "table (consumers then start from their queues' first offsets)")
        return t

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._table.setdefault(_key(group, topic), {})[queue_id] = offset
            self._changes += 1

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            return self._table.get(_key(group, topic), {}).get(queue_id)

    def snapshot(self) -> dict[str, dict[int, int]]:
        with self._lock:
            return {k: dict(v) for k, v in self._table.items()}

    def replace_all(self, snapshot: dict[str, dict[int, int]]) -> None:
        with self._lock:
            self._table = {k: dict(v) for k, v in snapshot.items()}
            self._changes += 1

    def persist(self) -> None:
        """Write the table atomically (see the module docstring). Raises
        OSError when it could not; the table stays dirty, so the next
        persist retries, and the files keep the last persisted table."""
        with self._persist_lock:
            with self._lock:
                table = {k: {str(q): o for q, o in sorted(v.items())}
                         for k, v in sorted(self._table.items())}
                doc: dict[str, Any] = {"offsetTable": table}
                changes = self._changes
            disk = self.disk
            disk.makedirs(self.directory)
            tmp = self.path + ".tmp"
            disk.write_file(tmp, json.dumps(doc, indent=1).encode())
            if self._before_rename is not None:
                self._before_rename()
            if disk.exists(self.path):
                disk.rename(self.path, self.path + ".bak")
            disk.rename(tmp, self.path)
            disk.fsync_dir(self.directory)
            self._persisted = changes

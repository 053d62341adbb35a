"""Reused memory for the bytes the CommitLog has appended but not yet written
to its files: RocketMQ's transient store pool, in miniature.

Under the POWER crash model appended records live only in this process until
a flush writes them, so a SIGKILL loses exactly what a power cut would. Held
in a fresh bytes object per batch, every page of every batch was faulted in
by the kernel and freed again after the flush (most of the append path's
time; see docs/performance-notes.md). Here records are encoded
straight into a few large bytearrays that are handed back once every chunk
in them has been flushed, and reused.

Ownership: the CommitLog (under its append lock; the flush's bookkeeping
takes the same lock) writes only into `current` from `used` on; a chunk it
queues is a memoryview of bytes already written, never written again until
every chunk in that buffer has been flushed. `chunk` counts the chunks
queued in a buffer, `flushed` discounts them; a buffer left with none goes
back to the free list (at most `keep` are kept; the rest are left to the
garbage collector), or, if it is `current`, is written from its start again.
Readers copy pending bytes under the lock (CommitLog.read), so a reused
buffer never changes what a reader got.
"""

from __future__ import annotations

PREALLOCATED = 4  # buffers allocated at open (at most `keep`)


class WriteBuffers:
    def __init__(self, buffer_bytes: int, keep: int = 8,
                 preallocated: int = PREALLOCATED) -> None:
        assert buffer_bytes > 0 and keep >= 0 and preallocated >= 0
        self.buffer_bytes = buffer_bytes
        self.keep = keep
        self.current = bytearray(buffer_bytes)
        self.used = 0
        # Part of the pool is allocated (and its pages touched: bytearray
        # zero-fills) up front, as RocketMQ's TransientStorePool.init() does,
        # so the first appends do not pay for faulting in fresh memory; not
        # all of it, which every node start would pay for (see
        # docs/performance-notes.md).
        self._free: list[bytearray] = [bytearray(buffer_bytes)
                                       for _ in range(min(keep, preallocated))]
        # id(buffer) -> chunks queued in it and not yet flushed; the buffer
        # itself is kept alive by the chunks (memoryviews) that name it.
        self._pending: dict[int, int] = {}
        self.allocated = 1 + len(self._free)  # buffers ever allocated (tests read it)

    @property
    def room(self) -> int:
        return self.buffer_bytes - self.used

    def chunk(self, start: int) -> memoryview:
        """Queue current[start:used] as one chunk (counted until flushed)."""
        assert 0 <= start < self.used <= self.buffer_bytes, (start, self.used)
        key = id(self.current)
        self._pending[key] = self._pending.get(key, 0) + 1
        return memoryview(self.current)[start : self.used]

    def next_buffer(self) -> None:
        """Switch `current` to a fresh (or released) buffer."""
        old = self.current
        self.current = self._free.pop() if self._free else self._allocate()
        self.used = 0
        if id(old) not in self._pending:
            self._release(old)

    def flushed(self, chunks: list[memoryview | bytes]) -> None:
        """These queued chunks are in the file now: their buffers may be reused."""
        for c in chunks:
            if not isinstance(c, memoryview):
                continue
            buf = c.obj
            if not isinstance(buf, bytearray):
                continue
            left = self._pending.get(id(buf), 0) - 1
            if left > 0:
                self._pending[id(buf)] = left
                continue
            if left < 0:
                continue  # not one of ours (a chunk cut by a truncation)
            del self._pending[id(buf)]
            if buf is self.current:
                # Nothing unflushed is left in it: start over at its beginning.
                self.used = 0
            else:
                self._release(buf)

    def reset(self) -> None:
        """Forget every queued chunk (the CommitLog wrote or dropped them all)."""
        self._pending.clear()
        self.used = 0

    def _allocate(self) -> bytearray:
        self.allocated += 1
        return bytearray(self.buffer_bytes)

    def _release(self, buf: bytearray) -> None:
        if len(self._free) < self.keep:
            self._free.append(buf)

"""The put path: the one layer every put goes through (a node's puts,
MessageStore.put and put_batch, and so the group-commit benchmark).

Puts submitted in one loop tick join one batch. The batch is appended with
one CommitLog append (one lock, one buffer), then answered by `answer`: by
default once the flush the mode asks for covers it (store.on_flushed:
group commit under SYNC_FLUSH, nothing under ASYNC_FLUSH); a node gives
the path its own answer when it opens the store: after its flush and
replica waits (cluster/node/put_answer.py, decided by ha/sync_master.py).
Each submitter gets its slice of the results, once, from the loop, never
from inside submit(); a put is the store's from submit() on, whatever
happens to the submitter.

A batch takes at most MAX_BATCH_MESSAGES before the next one opens; one
that fills up is appended at once, so its flush can start while the rest
of the tick's puts are encoded (left to the end of the tick, every flush
waited for every producer). Group commit reads `pending` (batches
submitted and not yet appended) as its signal that more puts are coming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from store.config import StoreConfig
from store.log.commitlog import CommitLog
from store.log.record import Message
from store.status import PutResult, PutStatus

_log = logging.getLogger("dlab.store")

# Puts in one batch before the next opens: under load several flush groups
# are in flight, one group's fsync running while the next is encoded.
MAX_BATCH_MESSAGES = 32

OnDone = Callable[[list[PutResult]], object]
# Waits for what the mode promises, then calls batch.deliver (at least once
# for every submitter); gets the batch's results in submission order.
Answer = Callable[["PutBatch", list[PutResult]], None]
# The flush wait as a callback: `done` gets the flush status once `flushed`
# covers the end given (MessageStore.on_flushed).
OnFlushed = Callable[[int, Callable[[PutStatus], None]], None]


class PutBatch:
    """The puts submitted in one loop tick: appended together, then each
    submitter gets its slice of the results, once."""

    __slots__ = ("messages", "waiters", "drained", "_defer", "_loop", "_unanswered")

    def __init__(self, loop: asyncio.AbstractEventLoop, unanswered: set[PutBatch]) -> None:
        self.messages: list[Message] = []
        # (start, end, on_done) per submitter not answered yet.
        self.waiters: list[tuple[int, int, OnDone]] = []
        self.drained = False
        self._defer = False  # appended from inside submit(): answer from the loop
        self._loop = loop
        self._unanswered = unanswered

    def deliver(self, results: list[PutResult],
                only: Callable[[list[PutResult]], bool] | None = None) -> None:
        """Answer every submitter still waiting (or only those whose slice
        `only` accepts) with its slice of `results`."""
        if self._defer:
            self._loop.call_soon(self.deliver, results, only)
            return
        waiting = []
        for start, end, on_done in self.waiters:
            mine = results[start:end]
            if only is not None and not only(mine):
                waiting.append((start, end, on_done))
                continue
            try:
                on_done(mine)
            except Exception:  # one submitter's bug must not keep the others waiting
                _log.exception("a put's result callback failed")
        self.waiters = waiting
        if not waiting:
            self._unanswered.discard(self)

    def fail(self, results: list[PutResult], exc: Exception) -> None:
        """A bug in the answer: every submitter still waiting gets
        UNKNOWN_ERROR for its stored puts, rather than no answer at all."""
        _log.error("put path failed", exc_info=exc)
        self.deliver([r._replace(status=PutStatus.UNKNOWN_ERROR, detail=str(exc))
                      if r.status is PutStatus.PUT_OK else r for r in results])


class PutPath:
    """Coalesces puts into batches, appends each batch, answers it (see the
    module docstring). Lives on the store's loop (`loop`, set by
    MessageStore.start; the running loop until then)."""

    def __init__(self, log: CommitLog, config: StoreConfig,
                 append: Callable[[Sequence[Message]], list[PutResult]],
                 on_flushed: OnFlushed, *, answer: Answer | None = None) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        # Given when the path is built, never swapped: every batch of this
        # store is answered by the same rule.
        self._answer: Answer = answer or self.answer_when_flushed
        self.pending = 0  # batches submitted and not yet appended
        self.batches = 0  # batches appended (puts over batches: how much was coalesced)
        self.unanswered: set[PutBatch] = set()  # appended, a submitter not yet answered
        self._log = log
        self._config = config
        self._append = append
        self._on_flushed = on_flushed
        self._open: PutBatch | None = None

    def submit(self, messages: Sequence[Message], on_done: OnDone) -> None:
        """Put `messages` with this tick's batch; `on_done` gets their
        results, in order, once, from the loop (never from inside this
        call)."""
        # Kept, not asked for: CPython 3.11's get_running_loop() makes a
        # getpid() system call (see docs/performance-notes.md, "Group commit").
        loop = self.loop or asyncio.get_running_loop()
        if not messages:
            loop.call_soon(on_done, [])
            return
        batch = self._open
        if batch is None or len(batch.messages) >= MAX_BATCH_MESSAGES:
            batch = self._open = PutBatch(loop, self.unanswered)
            self.pending += 1
            loop.call_soon(self._drain, batch)
        start = len(batch.messages)
        batch.messages.extend(messages)
        batch.waiters.append((start, len(batch.messages), on_done))
        if len(batch.messages) >= MAX_BATCH_MESSAGES:
            batch._defer = True
            try:
                self._drain(batch)
            finally:
                batch._defer = False

    def _drain(self, batch: PutBatch) -> None:
        if batch.drained:
            return  # drained early, when it filled up
        batch.drained = True
        self.pending -= 1
        self.batches += 1
        if self._open is batch:
            self._open = None
        try:
            results = self._append(batch.messages)
        except Exception as exc:  # a bug: answer the batch, never leave it hanging
            _log.error("append failed", exc_info=exc)
            batch.deliver([PutResult(PutStatus.UNKNOWN_ERROR, msg_id=m.msg_id, detail=str(exc))
                           for m in batch.messages])
            return
        self.unanswered.add(batch)
        try:
            self._answer(batch, results)
        except Exception as exc:
            batch.fail(results, exc)

    def answer_when_flushed(self, batch: PutBatch, results: list[PutResult]) -> None:
        """The default answer: once the flush wait for the batch's last
        stored put is over."""
        ends = [r.end for r in results if r.status is PutStatus.PUT_OK]
        if not ends:
            batch.deliver(results)
            return

        def flushed(status: PutStatus) -> None:
            try:
                batch.deliver(self.flush_results(results, status))
            except Exception as exc:
                batch.fail(results, exc)

        self._on_flushed(max(ends), flushed)

    def flush_results(self, results: list[PutResult], status: PutStatus) -> list[PutResult]:
        """`results` with the flush wait's `status` given to every stored
        put (see flush_status)."""
        flushed = self._log.flushed
        out = []
        for r in results:
            s = flush_status(r, status, flushed)
            out.append(r if s is r.status else r._replace(status=s, detail=self.explain(s)))
        return out

    def explain(self, status: PutStatus) -> str:
        """The detail of a stored put whose flush wait ended with `status`."""
        if status is PutStatus.FLUSH_DISK_TIMEOUT:
            return (f"appended, but not flushed within {self._config.sync_flush_timeout_ms} "
                    "ms")
        return self._log.failed or status.value


def flush_status(r: PutResult, status: PutStatus, flushed: int) -> PutStatus:
    """The flush wait's outcome for one put: a batch waits for its last
    put's end, and a put whose own end was flushed when the wait ended is
    PUT_OK even if the batch's end was not. A put that was not stored keeps
    its own status."""
    if r.status is not PutStatus.PUT_OK:
        return r.status
    if status is PutStatus.FLUSH_DISK_TIMEOUT and flushed >= r.end:
        return PutStatus.PUT_OK
    return status

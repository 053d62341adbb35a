"""The store's background services on the event loop: the interval flush
(ASYNC_FLUSH), the checkpoint sync, and the consume-side service
(dispatch, consume queue flush, consumer offset persist). File IO runs on
the flush executor (store/seams/flush_executor.py). MessageStore.start starts
them; they stop when the store closes. MessageStore (store/store.py)
inherits them and owns the state they use (declared on the class).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from store.config import StoreConfig
from store.consume.consumequeue import ConsumeQueues
from store.consume.consumer_offsets import ConsumerOffsetTable
from store.log.commitlog import CommitLog, StoreFailedError
from store.seams.clock import Clock
from store.seams.flush_executor import FlushExecutor

_log = logging.getLogger("dlab.store")


class FlushServices:
    config: StoreConfig
    clock: Clock
    log: CommitLog
    queues: ConsumeQueues
    consumer_offsets: ConsumerOffsetTable
    offsets_error: str | None
    reput: Callable[[], None]
    _dispatch_pass: Callable[[], Awaitable[None]]
    _closing: bool
    _executor: FlushExecutor
    _flush_wakeup: asyncio.Event | None

    async def _consume_side_service(self) -> None:
        """Dispatch and flush the consume queues every
        consume_queue_flush_interval_ms; persist the consumer offset table
        every consumer_offset_persist_interval_ms (when it changed). Errors
        are logged and kept in state(); the service keeps running (a dead
        service would stop both silently)."""
        cfg = self.config
        last_persist = self.clock.monotonic()
        while not self._closing:
            await asyncio.sleep(cfg.consume_queue_flush_interval_ms / 1000)
            try:
                await self._dispatch_pass()
                await self._run(self._flush_queues)
            except Exception:  # a bug: say so, keep serving
                _log.exception("consume queue dispatch/flush failed")
            now = self.clock.monotonic()
            if (self.consumer_offsets.dirty
                    and now - last_persist >= cfg.consumer_offset_persist_interval_ms / 1000):
                last_persist = now
                try:
                    await self._run(self.consumer_offsets.persist)
                    self.offsets_error = None
                except OSError as exc:
                    if self.offsets_error is None:
                        _log.warning("persisting consumer offsets failed (%s); retrying", exc)
                    self.offsets_error = f"consumer offset persist failed: {exc}"

    def _flush_queues(self) -> None:
        """Flush the consume queues, then record in the checkpoint
        (logicsMsgTimestamp) up to which record their units are durable."""
        ts = self.queues.flush()
        if ts is not None:
            with contextlib.suppress(OSError):  # stale only widens recovery
                self.log.checkpoint.update_logics(ts)


    async def _run(self, fn: Any) -> Any:
        return await self._executor.run(fn)

    async def run_io(self, fn: Any) -> Any:
        """Run blocking file IO of the node's (e.g. persisting a synced
        offset table) where the store runs its own: its flush executor
        (a thread in production, inline in a simulation)."""
        return await self._executor.run(fn)

    async def _interval_flush(self) -> None:
        cfg = self.config
        least = cfg.flush_least_pages * cfg.page_size_bytes
        last_thorough = self.clock.monotonic()
        wakeup = self._flush_wakeup
        while not self._closing:
            if wakeup is None:
                await asyncio.sleep(cfg.flush_interval_ms / 1000)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(cfg.flush_interval_ms / 1000):
                        await wakeup.wait()
                wakeup.clear()
            now = self.clock.monotonic()
            thorough = now - last_thorough >= cfg.flush_thorough_interval_ms / 1000
            dirty = self.log.dirty_bytes
            if dirty and (dirty >= least or thorough):
                if thorough:
                    last_thorough = now
                try:
                    await self._run(self.log.flush)
                except StoreFailedError:
                    return

    async def _checkpoint_sync(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.config.flush_thorough_interval_ms / 1000)
            with contextlib.suppress(OSError):
                await self._run(self.log.sync_checkpoint)

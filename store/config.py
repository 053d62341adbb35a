"""Store configuration: one frozen dataclass, one validate(), presets."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from store.emulate import SWITCHES

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# The GIL switch interval a node process runs with (cluster/cli/node_command.py).
# The store's flush threads give the GIL up for every write and fsync; with
# the default 5 ms each return waits out the event loop's slice, and an
# ASYNC_FLUSH flusher fell so far behind a busy loop that a few flushes a
# second carried hundreds of MB each. Benchmarks of the store use it too.
NODE_SWITCH_INTERVAL_S = 0.0005


class FlushMode(enum.StrEnum):
    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


class CrashModel(enum.StrEnum):
    """Where appended bytes live before a flush.

    POWER: in the process's memory only; flush writes and fsyncs them, so a
    SIGKILL loses exactly what a power cut would. PROCESS: written to the OS at
    append; flush only fsyncs, so a SIGKILL loses nothing the OS holds."""

    POWER = "power"
    PROCESS = "process"


class CorruptionPolicy(enum.StrEnum):
    """What opening a store does when recovery finds damage in data that was
    flushed (a bad record with valid records after it, or before the
    checkpoint's flushed point; store/log/recovery.py tells it from a torn tail,
    which is always cut). After Protocol-Aware Recovery (FAST '18).

    REFUSE: do not open; the error names the damage and what cutting would
    lose. TRUNCATE: RocketMQ's behaviour, cut at the damage (logged at ERROR,
    kept in the recovery report) so the lab can show its cost. REPAIR: fetch
    the damaged range from a replica, CRC-verified, and write it in place;
    refuse when no replica holds it."""

    REFUSE = "refuse"
    TRUNCATE = "truncate"
    REPAIR = "repair"


class ConfigError(ValueError):
    """A setting is out of range; the message names it and the allowed range."""


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    segment_size_bytes: int = GIB
    max_message_size_bytes: int = 4 * MIB
    flush_mode: FlushMode = FlushMode.ASYNC_FLUSH
    crash_model: CrashModel = CrashModel.POWER
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    page_size_bytes: int = 4 * KIB
    flush_thorough_interval_ms: int = 10_000
    # RocketMQ's flushCommitLogTimed (default false): when false, an append
    # that leaves flush_least_pages dirty wakes the ASYNC_FLUSH flusher at once
    # (CommitLog.handleDiskFlush calls flushCommitLogService.wakeup()), and
    # flush_interval_ms is only the longest wait; when true the flusher runs
    # strictly every flush_interval_ms.
    flush_timed: bool = False
    sync_flush_timeout_ms: int = 5_000
    # ConsumeQueue files hold this many 20-byte units (RocketMQ:
    # mappedFileSizeConsumeQueue = 300,000 units); flushed every
    # consume_queue_flush_interval_ms (flushIntervalConsumeQueue).
    consume_queue_file_units: int = 300_000
    consume_queue_flush_interval_ms: int = 1_000
    # The consumer offset table is persisted this often (RocketMQ's
    # flushConsumerOffsetInterval) and at a clean close, never on a crash.
    consumer_offset_persist_interval_ms: int = 5_000
    store_host: tuple[str, int] = ("127.0.0.1", 0)
    # Appended bytes not yet in the files are encoded into reused buffers of
    # this size (store/log/writebuffers.py); up to write_buffers_kept idle ones
    # are kept. A record bigger than a buffer is queued on its own.
    write_buffer_bytes: int = 4 * MIB
    write_buffers_kept: int = 16
    # Of those, this many (at most write_buffers_kept) are allocated and
    # zero-filled at open, so the first appends do not fault fresh memory
    # in; the simulated cluster opens stores with none (they would be most
    # of a short sim run's memory: docs/performance-notes.md).
    write_buffers_preallocated: int = 4
    # Under the power crash model, an append that leaves more than this
    # unflushed (in memory) flushes before it returns, so memory stays
    # bounded when appends outrun the disk (RocketMQ's transient store pool
    # is a fixed set of buffers too). 0: no bound.
    max_unflushed_bytes: int = 256 * MIB
    # After each flush, drop the flushed pages from the page cache
    # (POSIX_FADV_DONTNEED). For a slave, whose log is read back only when
    # something fails over to it: its next writes reuse those pages instead
    # of taking fresh memory (CommitLog._drop_pages says why that matters).
    drop_flushed_pages: bool = False
    # Controller mode (set by the node): consumers read up to the confirm
    # offset the node sets from its SyncStateSet's acks (RocketMQ 5's
    # CommitLog.confirmOffset), not up to what this store wrote or flushed;
    # consume-queue dispatch stops there; the offset is kept in the
    # checkpoint and recovered at open (store/consume/consume_side.py,
    # docs/design.md "The confirm offset"). False: classic mode's rule.
    confirm_offset_by_acks: bool = False
    # What open does about damage in flushed data (CorruptionPolicy).
    corruption_policy: CorruptionPolicy = CorruptionPolicy.REFUSE
    # Known RocketMQ bugs re-introduced on purpose (store/emulate.py); empty:
    # the fixed behaviour.
    emulate: frozenset[str] = frozenset()

    def validate(self) -> StoreConfig:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        need(self.segment_size_bytes >= 4 * KIB, "segment_size_bytes must be at least 4096")
        need(
            self.segment_size_bytes <= 16 * GIB, "segment_size_bytes must be at most 16 GiB"
        )
        need(self.max_message_size_bytes >= 1, "max_message_size_bytes must be positive")
        need(
            self.max_message_size_bytes + 512 <= self.segment_size_bytes,
            f"max_message_size_bytes ({self.max_message_size_bytes}) must leave room for a "
            f"whole record (the body and up to 512 bytes more) in one segment "
            f"(segment_size_bytes {self.segment_size_bytes}): raise segment_size_bytes to at "
            f"least {self.max_message_size_bytes + 512} or lower max_message_size_bytes to "
            f"at most {max(1, self.segment_size_bytes - 512)}",
        )
        need(self.flush_interval_ms >= 1, "flush_interval_ms must be at least 1")
        need(self.write_buffers_preallocated >= 0, "write_buffers_preallocated must be 0 or more")
        need(self.flush_least_pages >= 0, "flush_least_pages must be 0 or more")
        need(self.page_size_bytes >= 1, "page_size_bytes must be positive")
        need(
            self.flush_thorough_interval_ms >= self.flush_interval_ms,
            "flush_thorough_interval_ms must be at least flush_interval_ms",
        )
        need(self.sync_flush_timeout_ms >= 1, "sync_flush_timeout_ms must be at least 1")
        need(self.consume_queue_file_units >= 1, "consume_queue_file_units must be at least 1")
        need(self.consume_queue_flush_interval_ms >= 1,
             "consume_queue_flush_interval_ms must be at least 1")
        need(self.consumer_offset_persist_interval_ms >= 1,
             "consumer_offset_persist_interval_ms must be at least 1")
        need(self.write_buffer_bytes >= 4 * KIB, "write_buffer_bytes must be at least 4096")
        need(self.write_buffers_kept >= 0, "write_buffers_kept must be 0 or more")
        need(self.max_unflushed_bytes >= 0, "max_unflushed_bytes must be 0 (no bound) or more")
        need(isinstance(self.flush_mode, FlushMode), "flush_mode must be a FlushMode")
        need(isinstance(self.crash_model, CrashModel), "crash_model must be a CrashModel")
        need(isinstance(self.corruption_policy, CorruptionPolicy),
             "corruption_policy must be a CorruptionPolicy (refuse, truncate or repair)")
        unknown = sorted(set(self.emulate) - set(SWITCHES))
        need(not unknown, f"emulate: unknown bug(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(SWITCHES))}")
        return self

    def with_(self, **changes: object) -> StoreConfig:
        return replace(self, **changes).validate()  # type: ignore[arg-type]


PRODUCTION = StoreConfig()
# Small segments so tests roll, recover and damage several of them quickly;
# small write buffers so appends switch buffers, and queue records bigger
# than a buffer on their own, all the time.
TESTING = StoreConfig(segment_size_bytes=64 * KIB, max_message_size_bytes=16 * KIB,
                      write_buffer_bytes=8 * KIB, write_buffers_kept=2)

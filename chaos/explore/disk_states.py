"""The disk states a power cut may leave on one node, enumerated instead of
drawn (store/sim/memory_disk.py's page-cache model).

A file's unsynced operations (writes and size changes, in order) survive as
a prefix: the first j whole, for every j; or the first j whole and the next
write torn at a sector boundary (its first bytes up to a multiple of
`sector_bytes` of the file, every such boundary inside it). Files are
independent of each other. Directory entries are as the model keeps them
(durable only once their directory is fsynced): not enumerated.

Two choices that leave a file the same bytes are one state: each file's
choices are deduplicated (file_choices says how), and a node's states are
the product of its files' distinct choices (of every crashed node's, for
`both`). `pruned` counts the raw states dropped as equivalent. A product
over `limit` states is cut to its first `limit` (in order: fewer operations
kept first, the file first in path order varying slowest), and says so.
Pure: takes what MemoryDisk.unsynced() returns and a reader of durable
bytes, returns choices.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from store.sim.memory_disk import Kept, PendingOp

SECTOR_BYTES = 512

# A node's disk state: path -> what a crash keeps of that file's unsynced writes.
NodeState = Mapping[str, Kept]
# A crash's disk states: node -> its state (every crashed node's).
CrashState = Mapping[str, NodeState]


@dataclass(frozen=True)
class States:
    """A crash's distinct disk states (at most the bound), and how many
    raw choices collapsed into them (`pruned`) or fell past the bound (`cut`)."""

    states: tuple[CrashState, ...]
    pruned: int
    cut: int


def file_choices(durable_len: int, pending: Sequence[PendingOp], sector_bytes: int,
                 durable_range: Callable[[int, int], bytes]) -> tuple[list[Kept], int]:
    """One file's choices, each leaving other bytes than the one before it,
    in order of how much is kept; and how many choices it had in all.

    The choices: for every j, the first j pending operations whole; and for
    each write, the operations before it whole and it torn at each sector
    boundary inside it. Walking them in that order, a choice that leaves
    the same bytes as the one before it (a torn part that writes what is
    there already, a size change to the size it has) is dropped. Only
    consecutive choices are compared (cheap: the bytes a write changes): two
    further apart that leave the same bytes both stay, so a dropped choice
    is always one another choice stands for."""
    lo = min([durable_len, *(pos for pos, _ in pending)])
    hi = max([lo, *(pos + len(data) for pos, data in pending if data is not None)])
    # The file's bytes in [lo, hi) after the operations applied so far; past
    # its length they are held as zeros (an extension reads zeros).
    buf = bytearray(durable_range(lo, hi).ljust(hi - lo, b"\0"))
    length = durable_len
    out = [Kept(0)]
    every = 1
    for whole, (pos, data) in enumerate(pending):
        if data is None:  # a size change
            every += 1
            if pos != length:
                out.append(Kept(whole + 1))
            if pos < length:
                buf[pos - lo:] = bytes(len(buf) - max(0, pos - lo))
            length = pos
            continue
        first = (pos // sector_bytes + 1) * sector_bytes
        cuts = [*range(first, pos + len(data), sector_bytes), pos + len(data)]
        every += len(cuts)
        done = 0  # bytes of the write the last choice kept
        for cut in cuts:
            kept = cut - pos
            same = (pos + kept <= length
                    and data[done:kept] == buf[pos + done - lo:pos + kept - lo])
            if not same:
                out.append(Kept(whole + 1) if kept == len(data) else Kept(whole, kept))
            done = kept
        buf[pos - lo:pos - lo + len(data)] = data
        length = max(length, pos + len(data))
    return out, every


def node_states(unsynced: Mapping[str, tuple[int, list[PendingOp]]],
                durable_range: Callable[[str, int, int], bytes], *,
                sector_bytes: int = SECTOR_BYTES) -> tuple[list[list[tuple[str, Kept]]], int]:
    """Per file with unsynced writes (path order), its distinct choices;
    and the number of raw states (the product of every file's choices)."""
    per_file: list[list[tuple[str, Kept]]] = []
    raw = 1
    for path, (durable_len, pending) in sorted(unsynced.items()):
        distinct, n = file_choices(durable_len, pending, sector_bytes,
                                   functools.partial(durable_range, path))
        per_file.append([(path, k) for k in distinct])
        raw *= n
    return per_file, raw


def crash_states(nodes: Mapping[str, tuple[list[list[tuple[str, Kept]]], int]],
                 limit: int) -> States:
    """Every combination of the crashed nodes' files' distinct choices, at
    most `limit` of them (`nodes`: node -> node_states())."""
    axes: list[list[tuple[str, str, Kept]]] = []
    raw = 1
    for node, (per_file, node_raw) in sorted(nodes.items()):
        axes += [[(node, path, k) for path, k in options] for options in per_file]
        raw *= node_raw
    distinct = 1
    for axis in axes:
        distinct *= len(axis)
    states = tuple(_state(combo, nodes) for combo in
                   itertools.islice(itertools.product(*axes), limit))
    return States(states, pruned=raw - distinct, cut=distinct - len(states))


def _state(combo: Iterable[tuple[str, str, Kept]], nodes: Iterable[str]) -> CrashState:
    out: dict[str, dict[str, Kept]] = {node: {} for node in nodes}
    for node, path, kept in combo:
        if kept != Kept(0):
            out[node][path] = kept
    return out


def to_json(state: CrashState) -> dict[str, dict[str, list[int]]]:
    """A state as params.json records it: node -> path -> [whole, torn_bytes]."""
    return {node: {path: [k.whole, k.torn_bytes] for path, k in sorted(files.items())}
            for node, files in sorted(state.items())}


def from_json(doc: object) -> CrashState:
    """A recorded state back (ValueError when it is not one)."""
    if not isinstance(doc, dict):
        raise ValueError("a disk state is an object node -> path -> [whole, torn_bytes]")
    out: dict[str, dict[str, Kept]] = {}
    for node, files in doc.items():
        if not isinstance(files, dict):
            raise ValueError(f"disk state of {node}: not an object path -> [whole, torn_bytes]")
        out[str(node)] = {str(p): Kept(int(v[0]), int(v[1])) for p, v in files.items()}
    return out

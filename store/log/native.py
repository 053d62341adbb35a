"""The optional native record codec (the `native/` crate, Rust via PyO3).

It implements only the hot loops: `encode_run_into` encodes a run of
ordinary messages into the caller's buffer, `scan` walks valid records in
stored bytes, `reput_groups` gathers the ConsumeQueue units of a range per
queue. Each
handles only the common all-IPv4 case exactly as `store.log.record` would and
stops at anything else, returning how far it got, so the Python code stays
the reference that decides and explains (tests cross-check the two).

`scripts/venv.sh` builds it where a Rust toolchain exists. Without it, or
with DLAB_PURE_PYTHON=1 in the environment, the three are None
and the pure-Python paths do the same work more slowly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

encode_run_into: Callable[..., tuple[int, int, bool]] | None = None
scan: Callable[[Any, int, int, int], tuple[int, int, int | None]] | None = None
reput_groups: Callable[[Any, int], tuple[int, int | None, list[Any]]] | None = None

# The interface version this code calls (dlab_native.ABI): a module built
# from older sources is not used (scripts/venv.sh rebuilds it).
ABI = 2


def _load() -> Any:
    if os.environ.get("DLAB_PURE_PYTHON"):
        return None
    try:
        import dlab_native
    except ImportError:
        return None
    return dlab_native if getattr(dlab_native, "ABI", 1) == ABI else None


_native = _load()
if _native is not None:
    encode_run_into = _native.encode_run_into
    scan = _native.scan
    reput_groups = _native.reput_groups


def codec() -> str:
    """Which codec this process uses: "native" or "python" (benchmarks record it)."""
    return "native" if encode_run_into is not None else "python"

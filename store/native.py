"""The optional native record codec (the `native/` crate, Rust via PyO3).

It implements only the hot loops: `encode_run_into` encodes a run of
ordinary messages into the caller's buffer, `scan` walks valid records in
stored bytes, `reput_groups` gathers the ConsumeQueue units of a range per
queue. Each
handles only the common all-IPv4 case exactly as `store.record` would and
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

if not os.environ.get("DLAB_PURE_PYTHON"):
    try:
        import dlab_native
    except ImportError:
        pass
    else:
        encode_run_into = dlab_native.encode_run_into
        scan = dlab_native.scan
        reput_groups = dlab_native.reput_groups


def codec() -> str:
    """Which codec this process uses: "native" or "python" (benchmarks record it)."""
    return "native" if encode_run_into is not None else "python"

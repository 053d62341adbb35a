"""Ctrl-C that a library cannot swallow. Python raises KeyboardInterrupt
wherever the main thread is when SIGINT arrives; inside a library call
that turns errors into its own (likely a blocking gRPC call, whose error a
run's status poll logs and goes on from; not proven) the interrupt can be
lost, and a matrix once ran to its end after Ctrl-C, exit 0. The CLI
marks the interrupt here as well (`watching`), and long loops ask
`check()` between their steps."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

requested = threading.Event()


def _on_sigint(_signum: int, _frame: FrameType | None) -> None:
    requested.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """SIGINT marks `requested` (then raises KeyboardInterrupt, as
    Python's own handler does) while the block runs; the handler before it
    is put back after. Outside the main thread, nothing changes."""
    requested.clear()
    try:
        before = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def check() -> None:
    """KeyboardInterrupt if Ctrl-C came since the command started, even if
    the exception it raised was swallowed on its way up."""
    if requested.is_set():
        raise KeyboardInterrupt

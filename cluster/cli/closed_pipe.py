"""A reader that stops early (`dlab cluster status | head -2`) is not an
error: the command stops quietly instead of ending in a BrokenPipeError
traceback. Python ignores SIGPIPE, so the first write to a pipe whose
reader is gone raises BrokenPipeError; the recipe of the Python docs'
"Note on SIGPIPE" (the `signal` module) is to point stdout at devnull, so
the flush at interpreter exit has nowhere to fail, and exit as a shell
reports a command SIGPIPE stopped (128 + SIGPIPE = 141).

Only a BrokenPipeError of our own output is swallowed: one from a pipe to a
child process or a socket is a real failure and is raised as before."""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import TextIO

EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def _reader_gone(stream: TextIO) -> bool:
    """Whether `stream` is a pipe whose read end is closed: poll() reports
    POLLERR on the write end of such a pipe (Linux and the BSDs)."""
    try:
        fd = stream.fileno()
    except (ValueError, OSError):  # closed, or not a real file (a test's StringIO)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def silence_closed_output() -> bool:
    """After a BrokenPipeError: if stdout or stderr lost its reader, point it
    at devnull (later writes and the exit flush go nowhere) and return True;
    False when neither did (the error was another pipe's)."""
    silenced = False
    for stream in (sys.stdout, sys.stderr):
        if _reader_gone(stream):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
            silenced = True
    return silenced


def flush_output() -> None:
    """Flush stdout while a closed pipe can still be caught, not at
    interpreter exit where it prints "Exception ignored"."""
    sys.stdout.flush()

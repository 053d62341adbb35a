"""What every layer's commands share: UserError (an input error, printed as
one line with exit code 2 by the `dlab` entry, cluster/cli/main.py) and the
argparse `type=` helpers for sizes, counts, durations and directories.

They live in the bottom layer so that store/tools/cli.py and store/tools/bench.py can
use them without importing upwards (the layers contract in pyproject.toml)."""

from __future__ import annotations

import argparse
import os
import re


class UserError(Exception):
    """An error caused by input; printed as one line, exit code 2."""


_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$", re.IGNORECASE)
_UNITS = {None: 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '65536', '64KiB', '64M', '1GiB' (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or a unit, "
                                         "e.g. 65536, 64KiB, 64MiB, 1GiB")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNITS[unit]


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return v


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    v = _float(text)
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be more than 0")
    return v


def non_negative_float(text: str) -> float:
    v = _float(text)
    if v < 0 or v != v:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return v


def writable_dir(text: str) -> str:
    """A directory that exists and that this process may write in (where a
    benchmark puts its files)."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a directory; create it first, or leave the option out "
            "to use the system temp dir")
    if not os.access(text, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable by this user")
    return text

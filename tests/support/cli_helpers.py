"""Running `dlab` as a user does: a subprocess of the command-line entry
(chaos/cli.py), its output captured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dlab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`dlab ARGS...` from the repository root; never raises on its exit code."""
    return subprocess.run([sys.executable, "-m", "chaos.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=REPO)


def ok(*args: str) -> str:
    """`dlab ARGS...` must succeed without a traceback; its stdout."""
    r = dlab(*args)
    assert r.returncode == 0, f"dlab {' '.join(args)}: {r.stderr}"
    assert "Traceback" not in r.stderr
    return r.stdout


def fails(*args: str, message: str) -> None:
    """`dlab ARGS...` must be refused as bad input: exit 2, no traceback,
    `message` in the last line of stderr, which is an error."""
    r = dlab(*args)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert message in last and "error" in last, r.stderr

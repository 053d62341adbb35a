"""A command whose reader stops early (`dlab cluster status | head -2`)
ends quietly: no BrokenPipeError traceback (cluster/cli/closed_pipe.py).

Each command writes into a real pipe whose read end is already closed, so
its first write (or the flush at its end) meets EPIPE every time, not only
when the reader happens to exit before the writer."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli_helpers import REPO, dlab

from cluster.cli import main as cli_main

EXIT_CLOSED_PIPE = 141  # as a shell reports a command SIGPIPE stopped


def into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """`dlab ARGS...` with stdout a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "chaos.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO,
                              check=False)
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def cdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = str(tmp_path_factory.mktemp("pipe") / "c")
    up = dlab("cluster", "up", "--dir", d, "--slaves", "1", "--segment-size", "256KiB",
              "--node-args", "--max-message-size 64KiB")
    assert up.returncode == 0, up.stderr
    yield d
    dlab("cluster", "down", "--dir", d)


def test_cluster_status_into_a_closed_pipe_ends_quietly(cdir: str) -> None:
    r = into_closed_pipe("cluster", "status", "--dir", cdir)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode == EXIT_CLOSED_PIPE, r.stderr
    # The same command into a reader that reads is unchanged.
    assert "master" in dlab("cluster", "status", "--dir", cdir).stdout


@pytest.mark.parametrize("args", [
    ("chaos", "scenarios"),  # more than a pipe buffer's worth of writes: fails mid-way
    ("chaos", "plan", "--scenario", "master-crash-unflushed", "--seed", "1"),
    ("cluster", "status", "--dir", "no-such-cluster"),  # an error line on stderr only
])
def test_commands_into_a_closed_pipe_print_no_traceback(args: tuple[str, ...]) -> None:
    r = into_closed_pipe(*args)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode in (EXIT_CLOSED_PIPE, 2), r.stderr


def test_a_broken_pipe_that_is_not_our_output_still_raises() -> None:
    """A BrokenPipeError from a pipe to a child or a socket is a real
    failure: only our own closed output is quiet."""

    def register(sub: Any, bench_sub: Any) -> None:
        def handler(args: argparse.Namespace) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        sub.add_parser("boom").set_defaults(handler=handler)

    with pytest.raises(BrokenPipeError):
        cli_main.main(["boom"], register=(register,))

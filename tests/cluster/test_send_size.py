"""`dlab send --size` against the node's max message size: a size over it
is refused before anything is sent (exit 2, naming the maximum and the
option), and a size up to it is stored even where it is over the gRPC
limits a channel has by default (the client's 64 MiB send limit, the
node's 128 MiB receive limit): gRPC is never the limit a put meets first,
nor what keeps the message from a consumer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from support.cli_helpers import dlab

MIB = 1 << 20


def _cluster(d: str, *node_args: str, segment: str) -> None:
    up = dlab("cluster", "up", "--dir", d, "--slaves", "0", "--role", "ASYNC_MASTER",
              "--segment-size", segment, "--node-args", " ".join(node_args))
    assert up.returncode == 0, up.stderr


def _wrote(d: str) -> int:
    r = dlab("cluster", "status", "--dir", d, "--json")
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)[0]["status"]["wrote"])


@pytest.fixture(scope="module")
def default_max(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A node with the default max message size (4 MiB)."""
    d = str(tmp_path_factory.mktemp("size") / "c")
    _cluster(d, segment="64MiB")
    yield d
    dlab("cluster", "down", "--dir", d)


@pytest.mark.parametrize("size", ["64MiB", "4194305"])
def test_a_size_over_the_nodes_max_is_refused_before_sending(default_max: str,
                                                             size: str) -> None:
    before = _wrote(default_max)
    r = dlab("send", "--dir", default_max, "--count", "3", "--size", size)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "over the node's maximum message size of 4194304 bytes (4MiB)" in r.stderr
    assert "--size 4MiB or less" in r.stderr and "--max-message-size" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert _wrote(default_max) == before  # nothing was sent


def test_the_nodes_max_itself_is_stored(default_max: str) -> None:
    r = dlab("send", "--dir", default_max, "--count", "2", "--size", "4MiB", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == {"PUT_OK": 2}


def test_a_max_over_the_grpc_defaults_is_reached_by_grpc(tmp_path: str) -> None:
    # 130 MiB: over the client's 64 MiB send and the node's 128 MiB receive
    # limits as they were; a 256 MiB segment holds it.
    d = os.path.join(tmp_path, "c")
    _cluster(d, "--max-message-size", "130MiB", segment="256MiB")
    try:
        r = dlab("send", "--dir", d, "--count", "1", "--size", "130MiB", "--timeout", "120",
                 "--json", timeout=300)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert json.loads(r.stdout)["counts"] == {"PUT_OK": 1}
        assert _wrote(d) > 130 * MIB
        r = dlab("send", "--dir", d, "--count", "1", "--size", "131MiB")
        assert r.returncode == 2 and "(130MiB)" in r.stderr, r.stderr
        # And it comes back to a consumer: one pull carries it whole.
        r = dlab("consume", "--dir", d, "--group", "g", "--topic", "dlab-load", "--max", "1",
                 timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\t")[4] == f"{130 * MIB}B", r.stdout
    finally:
        dlab("cluster", "down", "--dir", d)

"""The divergence rule (chaos/check/divergence.py) on hand-made logs, and its
Spark-side entry (divergence_group) on the same rows as the report's query
hands them."""

from __future__ import annotations

from typing import Any

import pandas as pd

from chaos.check.divergence import divergence, divergence_group


def rec(offset: int, size: int = 10, crc: int = 1, msg_id: str | None = "m",
        record_hash: int | None = 7) -> dict[str, Any]:
    return {"offset": offset, "size": size, "body_crc": crc, "msg_id": msg_id,
            "record_hash": record_hash}


def test_equal_logs_do_not_diverge() -> None:
    log = [rec(0), rec(10), rec(20)]
    assert divergence([log, list(log)]) == (0, None)


def test_only_the_common_range_counts() -> None:
    """A slave behind, or ahead, differs only outside the common range."""
    master = [rec(0), rec(10), rec(20)]
    assert divergence([master, [rec(0)]]) == (0, None)
    assert divergence([master, [*master, rec(30, crc=9)]]) == (0, None)
    assert divergence([master, [rec(10, crc=2), rec(20)]]) == (1, 10)


def test_a_master_record_differing_from_two_slaves_counts_once() -> None:
    master = [rec(0), rec(10)]
    other = [rec(0), rec(10, msg_id="x")]
    assert divergence([master, other, other]) == (1, 10)


def test_every_part_of_the_identity_counts() -> None:
    master = [rec(0)]
    for changed in (rec(0, size=11), rec(0, crc=2), rec(0, msg_id="y"),
                    rec(0, record_hash=8)):
        assert divergence([master, [changed]]) == (1, 0), changed


def test_a_missing_record_hash_is_zero_on_both_sides() -> None:
    assert divergence([[rec(0, record_hash=None)], [rec(0, record_hash=0)]]) == (0, None)


def test_a_slave_record_at_another_offset_is_a_differing_master_record() -> None:
    """Records tile both logs: a slave record starting inside a master
    record means the master record at that start is not held."""
    master = [rec(0, size=20), rec(20)]
    slave = [rec(0, size=10), rec(10, size=10), rec(20)]
    assert divergence([master, slave]) == (1, 0)


def test_no_master_records_no_divergence() -> None:
    assert divergence([[], [rec(0)]]) == (0, None)
    assert divergence([]) == (0, None)


def test_the_spark_entry_leaves_out_malformed_rows_and_reads_nulls_as_the_rule_does() -> None:
    rows = [
        {"run": 3, "node": 0, **rec(0), "bad": False},
        {"run": 3, "node": 0, **rec(10, record_hash=None), "bad": False},
        {"run": 3, "node": 1, **rec(0), "bad": False},
        {"run": 3, "node": 1, **rec(10, record_hash=0), "bad": False},
        {"run": 3, "node": 1, **rec(0, crc=99), "bad": True},  # malformed: not judged
        {"run": 3, "node": 2, **rec(10, msg_id=None), "bad": False},
    ]
    out = divergence_group(pd.DataFrame(rows))
    assert out.to_dict("records") == [{"run": 3, "divergent_records": 1,
                                       "first_divergent_offset": 10}]

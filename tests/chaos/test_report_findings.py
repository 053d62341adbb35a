"""The report's plain-language finding per mode (chaos/report/document.py
`finding`), from a verdict table as the pipeline builds it."""

from __future__ import annotations

import pandas as pd

from chaos.report.document import finding


def _runs(**over: list[object]) -> pd.DataFrame:
    base: dict[str, list[object]] = {
        "scenario": ["master-crash", "master-crash"], "acked": [100, 100],
        "promise_violations": [0, 0], "acked_lost_master": [0, 0],
        "acked_lost_everywhere": [0, 0], "allowed_loss": [0, 0], "acked_stranded": [0, 0],
        "slave_ahead_at_restart_bytes": [0, 0], "slave_ahead_at_restart_messages": [0, 0],
        "slave_ahead_at_end_bytes": [0, 0], "slave_ahead_at_end_messages": [0, 0],
        "divergent_records": [0, 0], "duplicates": [0, 0], "puts": [110, 110],
        "failed": [10, 10], "delivered": [None, None],
    }
    return pd.DataFrame({**base, **over})


def test_a_slave_ahead_by_one_message_is_said_in_the_singular() -> None:
    text = finding("ASYNC_MASTER", "SYNC_FLUSH", _runs(
        slave_ahead_at_restart_bytes=[1703, 0], slave_ahead_at_restart_messages=[1, 0]))
    assert "A slave was ahead of the recovered master at its restart in 1 run " \
           "(up to 1,703 bytes, 1 message)." in text
    assert "at the end of the run" not in text


def test_a_mode_that_kept_everything_says_so_with_its_counts() -> None:
    text = finding("SYNC_MASTER", "SYNC_FLUSH", _runs(
        slave_ahead_at_end_bytes=[900, 4000], slave_ahead_at_end_messages=[2, 3]))
    assert "Over 2 runs (master-crash), 200 puts acknowledged." in text
    assert "No acknowledged message broke the mode's promise." in text
    assert "The recovered master kept every acknowledged message." in text
    assert "the master at the end of the run in 2 runs (up to 4,000 bytes, 3 messages)." in text
    assert "9.1% of puts failed." in text

"""When a run's end phase stops waiting for replication to settle: the
decision both backends' runs make (chaos/harness/runner.py on wall time, chaos/sim/run.py
on simulated time), on positions given to it — no clock, no status calls.

Stop when every slave holds what the master wrote (settled); when every
slave has been rejected as ahead (the slave-ahead policy keeps both logs:
waiting will not help); or when no slave has moved for `quiet_s` with no
load running (a diverged or refused slave will not catch up by waiting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SETTLED = "replication settled"
TIMED_OUT = "replication did not settle in time"


@dataclass
class SettleWatch:
    slaves: int
    started_s: float
    quiet_s: float = 1.0
    _last: list[int | None] = field(default_factory=list)
    _last_change_s: float | None = None

    def verdict(self, now_s: float, master_wrote: int | None,
                slaves_wrote: Sequence[int | None], rejected: Sequence[object],
                stall_note: str | None = None) -> str | None:
        """Why to stop waiting now, or None to look again. `stall_note`, if
        given, is added to a stall's words in parentheses (what the master
        says of its links)."""
        if self._last_change_s is None:
            self._last_change_s = self.started_s
        if master_wrote is not None and all(w is not None and w >= master_wrote
                                            for w in slaves_wrote):
            return SETTLED
        if rejected and len(rejected) == self.slaves:
            return f"slave(s) {', '.join(map(str, rejected))} rejected as ahead; logs kept"
        if list(slaves_wrote) != self._last:
            self._last, self._last_change_s = list(slaves_wrote), now_s
        elif now_s - self._last_change_s > self.quiet_s:
            note = f" ({stall_note})" if stall_note is not None else ""
            return f"replication stalled: master at {master_wrote}, slaves at {self._last}{note}"
        return None

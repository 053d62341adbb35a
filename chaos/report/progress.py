"""Progress of a report: its steps as lines, the run directories read and the
tasks of each Spark job as bars (tqdm, on stderr; bars only on a terminal).
Spark's own console progress bar is off (see chaos/spark_session.py): one
style, and no bar interleaved with our lines.

QuietProgress does nothing; build_report uses it unless given another.

MatrixProgress is a matrix's: a bar of the runs done (with its rate and
time left) on stderr, and one line per finished run on stdout.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from tqdm import tqdm

if TYPE_CHECKING:
    from pyspark import SparkContext


class Progress(Protocol):
    def step(self, text: str) -> None: ...

    def items(self, total: int, label: str) -> AbstractContextManager[Callable[[], None]]:
        """Yields a function to call once per item done."""
        ...

    def spark_job(self, sc: SparkContext, label: str) -> AbstractContextManager[None]:
        """Around the Spark actions of one step."""
        ...


class QuietProgress:
    def step(self, text: str) -> None:
        pass

    @contextmanager
    def items(self, total: int, label: str) -> Iterator[Callable[[], None]]:
        yield lambda: None

    @contextmanager
    def spark_job(self, sc: SparkContext, label: str) -> Iterator[None]:
        yield


class ConsoleProgress:
    """Steps as lines; bars when the stream is a terminal."""

    def __init__(self, stream: TextIO | None = None, poll_s: float = 0.5) -> None:
        self.stream = stream or sys.stderr
        self.poll_s = poll_s
        self.started = time.monotonic()  # the edge of the program: a clock is fine here

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        tqdm.write(f"dlab report: [{elapsed:6.1f} s] {text}", file=self.stream)

    @contextmanager
    def items(self, total: int, label: str) -> Iterator[Callable[[], None]]:
        with tqdm(total=total, desc=label, unit="run", file=self.stream, disable=None,
                  leave=False) as bar:
            yield lambda: bar.update(1)

    @contextmanager
    def spark_job(self, sc: SparkContext, label: str) -> Iterator[None]:
        group = f"dlab-{uuid.uuid4().hex[:8]}"
        sc.setJobGroup(group, label)
        bar = tqdm(total=0, desc=label, unit="task", file=self.stream, disable=None,
                   leave=False)
        stop = threading.Event()

        def update() -> None:
            tracker = sc.statusTracker()
            total = done = 0
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job else ():
                    stage = tracker.getStageInfo(stage_id)
                    if stage:
                        total += stage.numTasks
                        done += stage.numCompletedTasks
            bar.total = max(total, 1)
            bar.n = min(done, bar.total)
            bar.refresh()

        def poll() -> None:
            while not stop.wait(self.poll_s):
                update()

        poller = threading.Thread(target=poll, name="dlab-progress", daemon=True)
        if not bar.disable:
            poller.start()
        try:
            yield
        finally:
            stop.set()
            if poller.is_alive():
                poller.join()
            bar.close()
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


class MatrixProgress:
    """The runs of a matrix or sweep: `done(i, n, run)` for each finished
    run (anything with run_id and line) moves the bar and prints its line."""

    def __init__(self, total: int) -> None:
        self.total = total

    def __enter__(self) -> MatrixProgress:
        self.bar = tqdm(total=self.total, unit="run", file=sys.stderr, dynamic_ncols=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def done(self, i: int, n: int, run: Any) -> None:
        self.bar.update(1)
        self.bar.write(f"[{i}/{n}] {run.run_id}: {run.line}")

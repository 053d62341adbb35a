"""The SparkSession of a report: local by default, any master URL otherwise,
and quiet — Spark's INFO logging and console progress bar are off, only its
warnings and errors reach stderr.

Local mode binds the driver to 127.0.0.1 and runs no web UI, so a report
opens no port beyond loopback. With a master URL (spark://, yarn, k8s://)
the same job runs on the cluster unchanged; the run directories must then be
on a filesystem every executor sees at the same path.

Logging: the JVM reads its log4j2 configuration at start-up, so it is written
to a temporary file and named in spark.driver.extraJavaOptions. With
`log_path`, the JVM's stderr (its start-up notes such as "Using incubator
modules", and Spark's warnings) goes to that file, not the user's terminal:
the JVM inherits file descriptor 2 while it starts. A session
already running in this process (a test suite's, or the caller's) is reused
as it is and never stopped here.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[*]"
# For a short job (a report of a few runs: its JVM lives for seconds) the
# quick (C1) compiler alone: the tiered one's later optimisation never pays
# back its compile time (measured: session start, planning and the query
# each about 40 % faster on a one-run report).
_SHORT_JVM = "-XX:TieredStopAtLevel=1"

# Loggers that warn about this machine rather than the job: the missing
# native Hadoop library, a hostname that resolves to loopback (we bind to it
# on purpose), the string form of a plan too long to print.
_QUIET_LOGGERS = (
    "org.apache.hadoop.util.NativeCodeLoader",
    "org.apache.spark.util.Utils",
    "org.apache.spark.util.SparkStringUtils",
    "org.apache.spark.sql.execution.CacheManager",
)

LOG4J2 = "\n".join([
    "rootLogger.level = warn",
    "rootLogger.appenderRef.stderr.ref = console",
    "appender.console.type = Console",
    "appender.console.name = console",
    "appender.console.target = SYSTEM_ERR",
    "appender.console.layout.type = PatternLayout",
    "appender.console.layout.pattern = spark %p %c{1}: %m%n%ex",
    *(line for i, name in enumerate(_QUIET_LOGGERS) for line in (
        f"logger.q{i}.name = {name}", f"logger.q{i}.level = error")),
]) + "\n"

# pyspark warns on every toPandas() that it was not tested with pandas 3; the
# pipeline moves only small aggregated tables through pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")


@contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """File descriptor 2 pointed at `path` (appended) for the duration, so a
    child started meanwhile (the JVM) keeps writing there; Python's own
    sys.stderr is back on the terminal afterwards."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


@contextmanager
def spark_session(master: str | None = None, *, app_name: str = "dlab report",
                  driver_memory: str | None = None, log_path: str | None = None,
                  short_job: bool = False) -> Iterator[SparkSession]:
    """The active session if there is one, else a new one stopped on exit."""
    active = SparkSession.getActiveSession()
    if active is not None:
        if master and active.sparkContext.master != master:
            print(f"dlab: using the running Spark session ({active.sparkContext.master}), "
                  f"not {master}", file=sys.stderr)
        yield active
        return
    fd, log_conf = tempfile.mkstemp(prefix="dlab-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w") as f:
        f.write(LOG4J2)
    local = master is None or master.startswith("local")
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or LOCAL_MASTER)
        .config("spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile={log_conf}"
                + (" " + _SHORT_JVM if local and short_job else ""))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if local:
        # The Python workers run this interpreter (the one with the
        # project's packages: pandas, pyarrow), not whatever `python3` is
        # first on PATH: `.venv/bin/dlab report` from a shell without the
        # venv active otherwise failed in the first pandas UDF. PySpark's
        # driver reads PYSPARK_PYTHON when the context starts.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            # The JVM is both driver and executor: give it room for the
            # cached inputs of a large sweep (they spill to disk beyond it).
            .config("spark.driver.memory",
                    driver_memory or os.environ.get("DLAB_SPARK_DRIVER_MEMORY", "4g"))
        )
    try:
        with _stderr_to(log_path):
            spark = builder.getOrCreate()
    finally:
        os.unlink(log_conf)  # read by the JVM at start-up
    try:
        yield spark
    finally:
        spark.stop()

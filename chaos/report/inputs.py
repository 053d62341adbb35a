"""A report's inputs as Spark reads them: every history.jsonl and
nodes/*/records.jsonl parsed once with the declared schema (chaos/schema.py),
each row tagged with its run and node and flagged when malformed, then
shuffled by run once (chaos/report/pipeline.py's query reads that one exchange)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from chaos.check.run_dirs import STATUSES, RunInfo
from chaos.schema import HISTORY, OPTIONAL_FIELDS, RECORDS

CORRUPT = "_corrupt_record"
_SPARK_TYPES: dict[str, T.DataType] = {
    "str": T.StringType(), "int": T.LongType(), "bool": T.BooleanType(),
    "float": T.DoubleType(),
    # The pipeline reads no nested field in Spark (history's evidence is
    # judged in Python, chaos/check/evidence.py): kept as its JSON text.
    "dict": T.StringType(),
}
_BYTES_PER_PARTITION = 64 * 1024 * 1024
# Below this much input the query runs interpreted: compiling its generated
# code (a dozen stages of wide aggregations) takes longer than running it.
SMALL_INPUT_BYTES = 256 * 1024 * 1024


def spark_schema(fields: dict[str, tuple[str, bool, str]]) -> T.StructType:
    """The declared schema as Spark reads it: every field nullable (a missing
    or null required field is caught by _bad_row, with the file named),
    plus the column where Spark puts a line it cannot parse."""
    return T.StructType(
        [T.StructField(name, _SPARK_TYPES[typ], True) for name, (typ, _, _) in fields.items()]
        + [T.StructField(CORRUPT, T.StringType(), True)]
    )


def _bad_row(kind: str) -> Column:
    """True for a row that breaks the schema or the value checks; the Spark
    twin of chaos.check.run_dirs.check_large_row."""
    fields = {"history": HISTORY, "records": RECORDS}[kind]
    bad = F.col(CORRUPT).isNotNull()
    for name, (_, nullable, _) in fields.items():
        if not nullable and name not in OPTIONAL_FIELDS:
            bad = bad | F.col(name).isNull()
    if kind == "history":
        bad = bad | ~F.col("status").isin(sorted(STATUSES))
    # These checks also make Spark parse offset and size in history rows,
    # which the job does not use: Spark's JSON reader parses only the fields
    # a query refers to, and flags only those as corrupt.
    bad = bad | F.coalesce((F.col("offset") < 0) | (F.col("size") <= 0), F.lit(False))
    return F.coalesce(bad, F.lit(True))


_LISTING_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


@contextmanager
def _listed_in_driver(spark: SparkSession) -> Iterator[None]:
    """Spark looks up more than 32 paths (the threshold) with a job of a task
    per path: 3,000 files of a 1,000-run sweep made two jobs of several
    seconds each, where the driver stats them in well under one. The files
    are on a filesystem the driver sees (see chaos.spark_session), and one
    stat per file is all a listing of files needs. The setting is put back
    so the caller's later reads in the session list as before."""
    previous = spark.conf.get(_LISTING_THRESHOLD, None)
    spark.conf.set(_LISTING_THRESHOLD, str(2**31 - 1))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(_LISTING_THRESHOLD)
        else:
            spark.conf.set(_LISTING_THRESHOLD, previous)


def _read_large(spark: SparkSession, files: Sequence[tuple[str, int, int]], kind: str
                ) -> DataFrame:
    """Parse files of one kind; `files` is (path, run, node index). Each row
    gets `run` and `node_index` by a broadcast join on the file it came from.

    Spark's JSON reader skips blank lines (as chaos.schema.read_jsonl does)
    and puts a line it cannot read as the schema into CORRUPT, with one
    exception: a line holding an array of objects is read as those objects.
    Parsing lines as text with from_json would catch that too, at twice the
    cost of the whole scan; no writer of chaos.schema emits an array."""
    fields = {"history": HISTORY, "records": RECORDS}[kind]
    with _listed_in_driver(spark):
        df = (spark.read.schema(spark_schema(fields)).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT).json([f[0] for f in files]))
    by_path = {os.path.abspath(path): (run, node) for path, run, node in files}
    keys = []
    for uri in df.inputFiles():  # the form input_file_name() gives
        run, node = by_path[unquote(urlparse(uri).path)]
        keys.append((uri, run, node))
    assert len(keys) == len(files), "Spark lists other files than it was given"
    # Not null: else Spark infers `run IS NOT NULL` filters for later joins
    # and pushes them below the exchange, which then differs per branch.
    keys_df = spark.createDataFrame(keys, "file string, run int not null, "
                                          "node_index int not null")
    return (df.withColumn("bad", _bad_row(kind)).withColumn("file", F.input_file_name())
            .join(F.broadcast(keys_df), "file").drop("file"))


def inputs(spark: SparkSession, runs: Sequence[RunInfo]) -> tuple[DataFrame, DataFrame]:
    """History and records, parsed and shuffled by run — once: every branch
    of the query reads this one exchange.

    For Spark to reuse the exchange, its plan must be the same in every
    branch; but the optimizer narrows each branch's exchange to the columns
    that branch uses, which makes them differ (and parses the JSON again
    per branch). So the columns cross the exchange packed in one struct,
    which is not narrowed while nested schema pruning is off (_run_query);
    Likewise no branch may filter rows of the inputs on their own columns:
    Spark would push that filter below the exchange. Branches skip
    malformed rows with conditional expressions instead.
    tests/chaos/test_pipeline.py checks that the plan holds only two exchanges."""
    hist_files = [(r.history_path, r.index, 0) for r in runs]
    rec_files = [(n.records_path, r.index, n.index) for r in runs for n in r.nodes]
    size = sum(os.path.getsize(p) for p, _, _ in hist_files + rec_files)
    parts = max(spark.sparkContext.defaultParallelism, min(400, size // _BYTES_PER_PARTITION + 1))
    spark.conf.set("spark.sql.shuffle.partitions", str(parts))
    small = size < SMALL_INPUT_BYTES
    spark.conf.set("spark.sql.codegen.wholeStage", "false" if small else "true")
    # Adaptive execution re-plans after every stage: for a few MB, planning
    # is all it would do.
    spark.conf.set("spark.sql.adaptive.enabled", "false" if small else "true")

    def shuffled(df: DataFrame, *columns: Column | str) -> DataFrame:
        return (df.select("run", F.struct(*columns).alias("row"))
                .repartition(parts, "run").select("run", "row.*"))

    history = shuffled(_read_large(spark, hist_files, "history"), "op_id", "msg_id", "producer",
                       "invoke_ms", "complete_ms", "invoke_us", "complete_us", "offset",
                       "status", F.col("node").alias("acker_name"), "bad")
    records = shuffled(_read_large(spark, rec_files, "records"),
                       F.col("node_index").alias("node"), "offset", "size", "msg_id",
                       "body_crc", "record_hash", "bad")
    return history, records

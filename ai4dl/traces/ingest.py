"""Trace ingest: read an export, validate every row, MERGE the good ones into bronze, quarantine the rest.

Validation is a pure DataFrame transformation (:func:`validate`) so it is tested without files. Each bad row
lands in quarantine with the raw row as JSON and every reason it failed (``;``-separated), so an operator can
fix the export and ingest it again; nothing read is ever dropped without a trace.

Timestamps: a number is epoch seconds, or epoch milliseconds when it is at least 1e11 (1e11 s would be the
year 5138); anything else is parsed as an ISO-8601 / ``yyyy-MM-dd HH:mm:ss`` string in UTC. A number outside
years 1-9999 (or NaN/inf) is ``unparseable_timestamp``, never an overflow error of the whole job.

CSV shapes: each file is described by its own first two lines (:func:`describe_csv`) before Spark reads the
rows, so one folder may mix them: a delimiter among ``,`` ``;`` tab ``|`` (detected per file when
``ingest.delimiter`` is ``auto``, the default), a leading unnamed index column (pandas ``to_csv``), a UTF-8
byte-order mark, CRLF line ends, quoted or unquoted fields, any column order, ``.gz``/``.bz2`` compression.
None of these may cost a valid row its place in bronze.

Inputs that cannot be read at all are an :class:`InputError` of one line naming the file: a missing path, an
empty file (no header), a binary or UTF-16 file, a header lacking required columns (with a hint when the file
looks delimited by another character than the configured ``ingest.delimiter``). A header-only file ingests 0
rows. Extra columns are ignored (kept in quarantine's raw JSON); a blank service becomes ``unknown``.

Duplicates: rows sharing ``(pod_id, ts)`` inside one input keep the row with the smallest content hash
(independent of file order and partitioning); the others are quarantined as ``duplicate_key``. Against rows
already in bronze, the stored row wins: a rerun inserts nothing.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ai4dl.errors import InputError
from ai4dl.lake.schema import (
    BEHAVIOUR,
    BRONZE,
    EVENT_DATE,
    METRICS,
    POD_ID,
    QUARANTINE,
    SERVICE,
    SOURCE_COLUMNS,
    TS,
)

if TYPE_CHECKING:  # pragma: no cover
    from ai4dl.config import IngestConfig
    from ai4dl.lake.tables import Lake

MILLIS_THRESHOLD = 1e11
# Epoch seconds of 0001-01-01 and 10000-01-01: outside, a number is no timestamp Spark can hold.
MIN_EPOCH_SECONDS = -62_135_596_800
MAX_EPOCH_SECONDS = 253_402_300_800
DELIMITERS = (";", "\t", "|", ",")
REQUIRED = (POD_ID, TS, *METRICS)
# usage column -> the limit it is checked against (an absurd factor above it is a broken sample).
USAGE_LIMITS = {
    "cpu_usage_cores": "cpu_num_cores",
    "mem_current": "mem_limit",
    "mem_working_set": "mem_limit",
}
PERCENTS = ("cpu_usage_pct", "cpu_usage_pct_container_requested", "mem_usage_pct")


@dataclass(frozen=True)
class IngestResult:
    read: int
    valid: int
    inserted: int
    quarantined: int
    duplicates: int
    # Delta versions this ingest committed (None: nothing committed), for the run log.
    bronze_version: int | None = None
    quarantine_version: int | None = None

    def summary(self) -> str:
        return (
            f"read {self.read} rows: {self.valid} valid ({self.inserted} new in bronze, "
            f"{self.valid - self.inserted} already there), {self.quarantined} quarantined "
            f"({self.duplicates} duplicate keys)"
        )


def column_mapping(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Source column -> lake column, the export's defaults overlaid by the config's ``ingest.columns``."""
    mapping = dict(SOURCE_COLUMNS)
    for src, dst in (overrides or {}).items():
        mapping = {k: v for k, v in mapping.items() if v != dst}
        mapping[src] = dst
    return mapping


INDEX_COLUMN = "_index"  # a leading unnamed column (a pandas export's index): kept in raw, never used
CORRUPT_COLUMN = "_corrupt_record"  # the whole line of a row whose field count differs from its header's


@dataclass(frozen=True)
class CsvFile:
    """One CSV file as its own header describes it: the columns by position, whether a leading unnamed
    index column (data rows one field longer than the header) precedes them, and its delimiter."""

    path: str
    columns: tuple[str, ...]
    index_column: bool = False
    delimiter: str = ","

    @property
    def schema_columns(self) -> tuple[str, ...]:
        return ((INDEX_COLUMN,) if self.index_column else ()) + self.columns


def display_path(path: str) -> str:
    """A Hadoop ``file:`` URI as the local path a user typed; other URIs unchanged (for messages)."""
    if path.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(path).path)
    return path


def _split_line(line: str, delimiter: str) -> list[str]:
    import csv

    return next(csv.reader([line], delimiter=delimiter), [])


def list_files(spark: SparkSession, path: str | list[str]) -> list[str]:
    """The data files of a file, folder (recursively) or glob, or of a list of them, as Spark would read them
    (hidden ``.``/``_`` files skipped), sorted; through Hadoop's FileSystem so local paths and URIs list alike."""
    if not isinstance(path, str):
        return sorted({f for p in path for f in list_files(spark, p)})
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    pattern = jvm.org.apache.hadoop.fs.Path(path)
    fs = pattern.getFileSystem(conf)
    statuses = fs.globStatus(pattern) or []
    out: list[str] = []
    stack = list(statuses)
    while stack:
        status = stack.pop()
        name = status.getPath().getName()
        if name.startswith((".", "_")) and status.getPath().toString() != pattern.toString():
            continue
        if status.isDirectory():
            stack.extend(fs.listStatus(status.getPath()))
        else:
            out.append(status.getPath().toString())
    return sorted(out)


def _first_lines(spark: SparkSession, path: str, n: int = 2) -> list[str]:
    """The first ``n`` lines of a (possibly compressed) file, decoded as UTF-8 without a byte-order mark.

    Only these lines are read (through Hadoop's codecs, so ``.gz``/``.bz2`` work), never the whole file: the
    shape of a large export is known before Spark reads it.
    """
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    stream = hpath.getFileSystem(conf).open(hpath)
    codec = jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(conf).getCodec(hpath)
    if codec is not None:
        stream = codec.createInputStream(stream)
    reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
    try:
        lines = []
        for _ in range(n):
            line = reader.readLine()
            if line is None:
                break
            lines.append(str(line))
    finally:
        reader.close()
    if lines:
        lines[0] = lines[0].lstrip("\ufeff")
    if any("\x00" in line for line in lines):
        # UTF-16 text has a NUL beside every ASCII character; Parquet, zip and xlsx files have them too.
        raise InputError(
            f"{display_path(path)}: not a UTF-8 text CSV (binary, or UTF-16 text?); "
            "save it as UTF-8 CSV, or pass --format parquet for a Parquet file"
        )
    return lines


def sniff_delimiter(header: str, row: str | None = None) -> str:
    """The delimiter of a CSV file from its header line (and first data row), for ``ingest.delimiter: auto``.

    The candidate (``,`` ``;`` tab ``|``) that splits the header into the most fields wins, among those that
    split the first row into as many fields or one more (a pandas index); ``,`` when none splits anything.
    Quotes are respected, so a ``;`` inside a quoted column name does not count.

    >>> sniff_delimiter("timestamp;pod.id;cpu", "1;a;0,5")
    ';'
    >>> sniff_delimiter('"a;b",c,d', "1,2,3")
    ','
    >>> sniff_delimiter("ts|pod", "0|1|a")
    '|'
    """
    best, most = ",", 1
    for d in DELIMITERS:
        n = len(_split_line(header, d))
        if row is not None and row.strip() and len(_split_line(row, d)) not in (n, n + 1):
            continue
        if n > most or (n == most and n > 1 and d == ","):
            best, most = d, n
    return best


def describe_csv(spark: SparkSession, path: str, delimiter: str = "auto") -> CsvFile | None:
    """How one file's rows are laid out, from its header and first data row; None for an empty file.

    ``delimiter`` ``"auto"`` detects it per file (:func:`sniff_delimiter`). A header one field shorter than its
    rows is an index without a label (the original AI4DL ``sample-vr.csv``), a header whose first name is
    empty a pandas ``to_csv`` index: the extra leading column is the index. Any other mismatch, a duplicated
    column name or an unnamed column is an :class:`InputError` naming the file.
    """
    lines = _first_lines(spark, path)
    where = display_path(path)
    if not lines or not lines[0].strip():
        return None
    if delimiter == "auto":
        delimiter = sniff_delimiter(lines[0], lines[1] if len(lines) > 1 else None)
    header = [c.strip() for c in _split_line(lines[0], delimiter)]
    index = False
    if len(lines) > 1 and lines[1].strip():
        width = len(_split_line(lines[1], delimiter))
        if width == len(header) + 1:
            index = True
        elif width != len(header) and len(header) > 1:
            raise InputError(
                f"{where}: the header has {len(header)} fields but the first row has {width}; "
                "fix the header (or the delimiter, ingest.delimiter)"
            )
    if header and header[0] == "" and len(header) > 1:  # an index column with an empty label
        header[0], index = INDEX_COLUMN, False
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise InputError(f"{where}: column(s) {', '.join(repr(c) for c in dupes)} appear more than once in the header")
    if "" in header:
        raise InputError(f"{where}: the header has an unnamed column at position {header.index('') + 1}")
    return CsvFile(path, tuple(header), index, delimiter)


def read_csv_by_header(spark: SparkSession, path: str | list[str], delimiter: str = "auto") -> tuple[DataFrame | None, list[CsvFile]]:
    """Every file read by its own header, then the files united by column name.

    Spark's CSV reader takes one header for a whole folder and reads the other files by position, so a file
    with its columns in another order would silently land in the wrong columns. Here the files are grouped
    by identical header and delimiter and each group is read with that header as an explicit all-string
    schema; groups are united by name (a column a file lacks is null there). A row whose field count differs
    from its header keeps its whole line in ``_corrupt_record``. Only each file's first two lines are read
    here; the rows themselves are read by Spark.
    """
    files = list_files(spark, path)
    if not files:
        raise InputError(f"{path}: no such input")
    described = [d for d in (describe_csv(spark, f, delimiter) for f in files) if d is not None]
    groups: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for d in described:
        groups.setdefault((d.schema_columns, d.delimiter), []).append(d.path)
    frames = []
    for (columns, sep), paths in groups.items():
        schema = T.StructType([T.StructField(c, T.StringType(), True) for c in (*columns, CORRUPT_COLUMN)])
        reader = (
            spark.read.schema(schema).option("header", "true").option("enforceSchema", "true")
            .option("delimiter", sep).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        )
        frames.append(reader.csv(paths).withColumn("source_file", F.col("_metadata.file_path")))
    if not frames:
        return None, described
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other, allowMissingColumns=True)
    return df, described


def guess_format(spark: SparkSession, path: str, default: str = "csv") -> str:
    """``delta`` for a folder holding ``_delta_log``, ``parquet`` when every file is ``.parquet``, else
    ``default``: what ``ai4dl demo --input PATH`` reads without ``--format``."""
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if fs.exists(jvm.org.apache.hadoop.fs.Path(hpath, "_delta_log")):
        return "delta"
    files = list_files(spark, path)
    if files and all(f.endswith(".parquet") for f in files):
        return "parquet"
    return default


def read_source(spark: SparkSession, path: str, fmt: str = "csv", delimiter: str = "auto") -> DataFrame:
    """Read an export as it is: CSV columns stay strings so a bad number is seen, not nulled by inference."""
    if fmt == "csv":
        df, _ = read_csv_by_header(spark, path, delimiter)
        if df is None:
            raise InputError(f"{path}: empty input (no header)")
        return df
    if fmt in ("parquet", "delta"):
        df = spark.read.format(fmt).load(path)
    else:
        raise InputError(f"{path}: unknown input format '{fmt}' (csv, parquet or delta)")
    return df.withColumn("source_file", F.col("_metadata.file_path")) if fmt != "delta" else df.withColumn(
        "source_file", F.lit(path)
    )


def _delimiter_hint(columns: list[str], delimiter: str) -> str:
    """'; the header looks ';'-delimited ...' when one column's name holds another delimiter, else ''."""
    if len(columns) != 1:
        return ""
    for d in DELIMITERS:
        if d != delimiter and d in columns[0]:
            shown = "\\t" if d == "\t" else d
            return (
                f"; the header looks '{shown}'-delimited, not '{delimiter}': rerun with --set ingest.delimiter='{shown}'"
                " (or ingest.delimiter=auto)"
            )
    return ""


def check_columns(columns: list[str], mapping: dict[str, str], where: str, delimiter: str = ",") -> dict[str, str]:
    """Source -> lake names of the columns present; a missing required column is a one-line error."""
    columns = [c for c in columns if c not in ("source_file", CORRUPT_COLUMN, INDEX_COLUMN)]
    if not columns:
        raise InputError(f"{where}: empty input (no header)")
    present = {src: dst for src, dst in mapping.items() if src in columns}
    have = {dst for dst in present.values()}
    missing = [c for c in REQUIRED if c not in have]
    if missing:
        want = {dst: src for src, dst in mapping.items()}
        names = ", ".join(f"'{want.get(c, c)}'" for c in missing)
        hint = _delimiter_hint(columns, delimiter)
        shown = ", ".join(columns)
        if len(shown) > 300:
            shown = shown[:300] + "..."
        raise InputError(f"{where}: missing column(s) {names}{hint}; the file has: {shown}")
    return present


def _parse_ts(c: Column) -> Column:
    num = c.try_cast(T.DoubleType())
    as_string = c.cast(T.StringType())
    finite = num.isNotNull() & ~F.isnan(num) & (F.abs(num) != float("inf"))
    millis = F.abs(num) >= MILLIS_THRESHOLD
    seconds = F.when(millis, num / 1000.0).otherwise(num)
    in_range = (seconds >= MIN_EPOCH_SECONDS) & (seconds < MAX_EPOCH_SECONDS)
    from_number = F.when(millis, F.timestamp_micros((num * 1000).cast("long"))).otherwise(
        F.timestamp_micros((num * 1_000_000).cast("long"))
    )
    # Only a finite, in-range number reaches the casts (ANSI mode would fail the job on an overflow).
    return (
        F.when(finite & in_range, from_number)
        .when(num.isNotNull(), F.lit(None).cast(T.TimestampType()))
        .otherwise(F.try_to_timestamp(as_string))
    )


# Whitespace and control characters, Unicode-wide (Spark's trim only strips ' ').
_SPACE = r"[\p{Z}\p{Cc}]"


def _blank(c: Column) -> Column:
    return c.isNull() | c.cast("string").rlike(f"^{_SPACE}*$")


def _strip(c: Column) -> Column:
    return F.regexp_replace(c.cast("string"), f"^{_SPACE}+|{_SPACE}+$", "")


def validate(
    df: DataFrame,
    mapping: dict[str, str] | None = None,
    max_usage_factor: float = 10.0,
    where: str = "input",
    delimiter: str = ",",
) -> DataFrame:
    """Typed rows in bronze's columns plus ``reasons`` (null when the row is valid) and ``raw``/``raw_hash``.

    One output row per input row: a row is either valid (``reasons`` null, ``pod_id`` non-blank, ``ts`` set,
    every metric finite and >= 0) or carries every reason it failed.
    """
    mapping = mapping if mapping is not None else column_mapping()
    present = check_columns(df.columns, mapping, where, delimiter)
    numeric = tuple(f.name for f in df.schema.fields if isinstance(f.dataType, T.NumericType))
    out = df.select(*_validation_columns(
        df.sparkSession, tuple(df.columns), tuple(present.items()), float(max_usage_factor), numeric))
    out = out.withColumn("reasons", F.when(F.col("reasons") == "", None).otherwise(F.col("reasons")))
    # raw and raw_hash are only computed where a query uses them (the quarantine); row_hash is the cheap,
    # order-independent content hash that picks the surviving row among duplicates.
    return out.withColumn("raw_hash", F.sha2(F.col("raw"), 256))


def _validation_columns(spark: SparkSession, columns: tuple[str, ...], present: tuple[tuple[str, str], ...],
                        max_usage_factor: float, numeric: tuple[str, ...] = ()) -> list[Column]:
    """The expressions of :func:`validate` for an input of these columns, built once per session and shape.

    Building them is some 2,300 py4j calls (0.5-1 s of an ingest of a small file, more than its Spark jobs); the
    expressions name columns only, so the same ones apply to every input of the same columns. Kept on the
    SparkContext: a new session builds its own."""
    cache = spark.sparkContext.__dict__.setdefault("_ai4dl_validation_columns", {})
    key = (columns, present, max_usage_factor, numeric)
    if key not in cache:
        cache[key] = _build_validation_columns(columns, dict(present), max_usage_factor, frozenset(numeric))
    return cache[key]


def _build_validation_columns(columns: tuple[str, ...], present: dict[str, str], max_usage_factor: float,
                              numeric: frozenset[str] = frozenset()) -> list[Column]:
    source_cols = [c for c in columns if c not in ("source_file", CORRUPT_COLUMN)]
    fields = F.to_json(F.struct(*[F.col(f"`{c}`") for c in source_cols]), {"ignoreNullFields": "false"})
    corrupt = F.col(CORRUPT_COLUMN) if CORRUPT_COLUMN in columns else F.lit(None).cast("string")
    # A malformed row keeps its whole line: its fields were cut or padded to the header's width.
    raw = F.when(corrupt.isNotNull(), F.to_json(F.struct(corrupt.alias("line")))).otherwise(fields)
    src = {dst: F.col(f"`{s}`") for s, dst in present.items()}
    # A column the source already types as a number (a Parquet or Delta export) is blank only when null: its
    # text form is never whitespace, so the per-row cast to text and the regular expression are skipped
    # (most of the validation's cost on 10 numeric columns).
    typed_numbers = {dst for s, dst in present.items() if s in numeric}

    def blank(name: str) -> Column:
        return src[name].isNull() if name in typed_numbers else _blank(src[name])

    checks: list[tuple[Column, str]] = []  # (failed, reason)
    typed: dict[str, Column] = {}
    pod = _strip(src[POD_ID])
    checks.append((blank(POD_ID), "missing_id"))
    ts = _parse_ts(src[TS])
    checks.append((blank(TS), "missing_timestamp"))
    checks.append((~blank(TS) & ts.isNull(), "unparseable_timestamp"))
    for m in METRICS:
        value = src[m].try_cast(T.DoubleType())
        typed[m] = value
        checks.append((blank(m), f"missing_value:{m}"))
        checks.append((~blank(m) & value.isNull(), f"unparseable_number:{m}"))
        finite = ~F.isnan(value) & (F.abs(value) != float("inf"))
        checks.append((value.isNotNull() & ~finite, f"non_finite:{m}"))
        checks.append((value.isNotNull() & finite & (value < 0), f"negative:{m}"))
    for usage, limit in USAGE_LIMITS.items():
        u, lim = typed[usage], typed[limit]
        bad = (lim > 0) & (u > lim * max_usage_factor) & ~F.isnan(u) & ~F.isnan(lim)
        checks.append((bad, f"usage_above_limit:{usage}"))
    for pct in PERCENTS:
        v = typed[pct]
        checks.append(((v > 100.0 * max_usage_factor) & ~F.isnan(v), f"usage_above_limit:{pct}"))

    checks.insert(0, (corrupt.isNotNull(), "malformed_row"))
    # The list of reasons (an array filtered by a lambda: interpreted, not compiled) is built only for a row that
    # failed some check; the test of all of them at once is one compiled expression (on a valid 10-column Parquet
    # export, this is most of what validation costs). A null test is a check not failed, as in the list.
    failed_any = functools.reduce(operator.or_, (failed for failed, _ in checks))
    listed = F.array(*[F.when(failed, F.lit(reason)) for failed, reason in checks])
    reasons = F.when(failed_any, F.array_join(F.filter(listed, lambda x: x.isNotNull()), ";"))
    # A blank service would be a null partition value (NOT NULL in bronze): it is "unknown", like a missing one.
    service = (
        F.when(blank(SERVICE), F.lit("unknown")).otherwise(_strip(src[SERVICE]))
        if SERVICE in src
        else F.lit("unknown")
    )
    behaviour = src[BEHAVIOUR].cast("string") if BEHAVIOUR in src else F.lit(None).cast("string")
    return [
        pod.alias(POD_ID),
        service.alias(SERVICE),
        ts.alias(TS),
        *[typed[m].alias(m) for m in METRICS],
        behaviour.alias(BEHAVIOUR),
        F.col("source_file") if "source_file" in columns else F.lit(None).cast("string").alias("source_file"),
        raw.alias("raw"),
        reasons.alias("reasons"),
        F.xxhash64(*[F.col(f"`{c}`") for c in source_cols]).alias("row_hash"),
    ]


def rank_duplicates(validated: DataFrame) -> DataFrame:
    """Typed rows (no raw JSON) with ``_rank``: 1 for the row kept per ``(pod_id, ts)`` (smallest content hash,
    then source file), > 1 for valid duplicates, null for invalid rows."""
    typed = validated.drop("raw", "raw_hash")
    w = Window.partitionBy(POD_ID, TS, F.col("reasons").isNull()).orderBy("row_hash", "source_file")
    return typed.withColumn("_rank", F.when(F.col("reasons").isNull(), F.row_number().over(w)))


def split_duplicates(valid: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(kept, duplicates) of valid rows: one row per ``(pod_id, ts)``, the smallest content hash winning."""
    ranked = rank_duplicates(valid)
    return ranked.where("_rank = 1").drop("_rank"), ranked.where("_rank > 1").drop("_rank")


def duplicate_rows(validated: DataFrame, ranked: DataFrame) -> DataFrame:
    """The raw rows that lost to a duplicate, with how often each occurred (``source_file, raw, reasons,
    occurrences``): the losers' keys are few, so the raw JSON is fetched for them alone."""
    keys = ["source_file", POD_ID, TS, "row_hash"]
    losers = ranked.where(F.col("_rank") > 1).groupBy(*keys).agg(F.count(F.lit(1)).alias("occurrences")).alias("l")
    raw = validated.where(F.col("reasons").isNull()).select(*keys, "raw").dropDuplicates(keys).alias("r")
    cond = [F.col(f"l.{k}").eqNullSafe(F.col(f"r.{k}")) for k in keys]
    return losers.join(raw, cond).select(
        F.col("l.source_file").alias("source_file"), F.col("r.raw").alias("raw"),
        F.lit("duplicate_key").alias("reasons"), F.col("l.occurrences").alias("occurrences"),
    )


def to_bronze(kept: DataFrame) -> DataFrame:
    now = F.current_timestamp()
    df = kept.withColumn("ingested_at", now).withColumn(EVENT_DATE, F.to_date(F.col(TS)))
    return df.select(*[F.col(f.name).cast(f.dataType) for f in BRONZE.fields])


def to_quarantine(bad: DataFrame) -> DataFrame:
    """One quarantine row per distinct (file, raw row, reasons); ``occurrences`` counts identical copies."""
    if "occurrences" not in bad.columns:
        bad = bad.withColumn("occurrences", F.lit(1).cast("long"))
    grouped = bad.groupBy("source_file", "raw", "reasons").agg(F.sum("occurrences").alias("occurrences"))
    df = grouped.withColumnRenamed("reasons", "reason").withColumn("raw_hash", F.sha2(F.col("raw"), 256))
    df = df.withColumn("quarantined_at", F.current_timestamp())
    return df.select(*[F.col(f.name).cast(f.dataType) for f in QUARANTINE.fields])


def ingest(lake: Lake, settings: IngestConfig, path: str | list[str] | None = None, fmt: str | None = None) -> IngestResult:
    """Ingest one export (file, folder or glob; or a list of them, e.g. the new files of a stream's
    micro-batch) into bronze and quarantine; rerunning it changes nothing."""
    spark = lake.spark
    path = path or settings.input
    if not path:
        raise InputError("no input: pass a path or set ingest.input")
    if not isinstance(path, str):
        paths = list(path)
        path = paths[0] if len(paths) == 1 else paths
    where = path if isinstance(path, str) else f"{path[0]} and {len(path) - 1} more files"
    fmt = fmt or settings.format
    mapping = column_mapping(dict(settings.columns))
    try:
        if fmt == "csv":  # each file by its own header, each checked for the required columns by name
            source, files = read_csv_by_header(spark, path, settings.delimiter)
            for f in files:
                check_columns(list(f.columns), mapping, display_path(f.path), f.delimiter)
            if source is None:
                raise InputError(f"{where}: empty input (no header)")
        else:
            source = read_source(spark, path, fmt, settings.delimiter)
    except InputError:
        raise
    except Exception as exc:  # Spark's AnalysisException for a missing path: say it in one line
        text = str(exc)
        if "PATH_NOT_FOUND" in text or "does not exist" in text:
            raise InputError(f"{where}: no such input") from None
        if "UNABLE_TO_INFER_SCHEMA" in text or "DELTA_MISSING_DELTA_TABLE" in text or "not a Delta table" in text:
            raise InputError(f"{where}: cannot read as {fmt} ({text.splitlines()[0][:200]})") from None
        raise
    return ingest_source(lake, settings, source, where)


def ingest_source(lake: Lake, settings: IngestConfig, source: DataFrame, where: str) -> IngestResult:
    """Validate rows in the export's columns (all strings, plus ``source_file``) and MERGE them into bronze and
    quarantine: the one path every source takes (a CSV export, a Prometheus range), so the rules are the same."""
    mapping = column_mapping(dict(settings.columns))
    validated = validate(source, mapping, settings.max_usage_factor, where=where, delimiter=settings.delimiter)
    # Only the narrow typed rows are cached (no raw JSON): one parse of the input serves the bronze MERGE and
    # the counts; the raw rows are re-read, filtered, for the quarantine alone.
    ranked = rank_duplicates(validated).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        status = F.when(F.col("reasons").isNotNull(), "bad").when(F.col("_rank") > 1, "duplicate").otherwise("kept")
        counts = {r["s"]: r["n"] for r in ranked.groupBy(status.alias("s")).agg(F.count("*").alias("n")).collect()}
        n_kept, n_dups, n_bad = counts.get("kept", 0), counts.get("duplicate", 0), counts.get("bad", 0)

        # The MERGE's own metrics: exact even when another ingest commits into the same table meanwhile.
        kept = ranked.where(F.col("_rank") == 1).drop("_rank")
        merged = lake.merge_new("bronze", to_bronze(kept))
        if n_bad or n_dups:  # the raw rows are read again only when some are quarantined
            bad = validated.where(F.col("reasons").isNotNull()).select("source_file", "raw", "reasons")
            if n_dups:
                bad = bad.withColumn("occurrences", F.lit(1).cast("long")).unionByName(duplicate_rows(validated, ranked))
            q = lake.merge_new("quarantine", to_quarantine(bad))
        else:
            from ai4dl.lake.tables import MergeOutcome

            lake.ensure("quarantine")  # readers find the table, empty, as after any ingest
            q = MergeOutcome(inserted=0, version=None)
        return IngestResult(
            read=n_kept + n_dups + n_bad,
            valid=n_kept,
            inserted=merged.inserted,
            quarantined=n_bad + n_dups,
            duplicates=n_dups,
            bronze_version=merged.version,
            quarantine_version=q.version,
        )
    finally:
        ranked.unpersist()

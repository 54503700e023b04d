"""The lake: tables by logical name behind one handle, and the Delta writes every stage shares.

:class:`Lake` is to the whole lake what ``DeltaTable.forPath`` is to one table: ``lake.read("silver")``,
``lake.overwrite("phases", df, properties=...)``, ``lake.merge_new("bronze", df)``, ``lake.properties(...)``,
``lake.version(...)``, ``lake.log_run(...)``. Each logical name knows its path under the root
(``<root>/<layer>/<name>``), its declared schema, partitioning, MERGE key and Z-order columns
(:data:`TABLES`), so no stage repeats them. Paths and URIs are joined in one place (:func:`join_path`), so
the same job runs on local disk, HDFS, S3 or DBFS. The path-level functions below (:func:`overwrite`,
:func:`merge_new`, :func:`properties`) do the work and are usable on any Delta path.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ai4dl.errors import ConfigError, MissingTableError
from ai4dl.lake import schema as S

MERGE_RETRIES = 6



@dataclass(frozen=True)
class TableSpec:
    """What the lake knows about one logical table."""

    path: str  # relative to the lake root
    schema: StructType
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = ()  # MERGE key of append-only tables
    zorder: tuple[str, ...] = ()  # OPTIMIZE ZORDER BY columns (rows of one container together)
    # The columns Delta keeps min/max statistics for: those readers filter or Z-order on. Empty: Delta's default,
    # the first 32 columns, which on the large tables means every metric and feature: write time for nothing.
    stats: tuple[str, ...] = ()

    @property
    def table_name(self) -> str:
        """Its name in a catalog: the path's layer and name, ``gold/phase_stats`` -> ``gold_phase_stats``."""
        return self.path.replace("/", "_").lstrip("_")

    @property
    def table_properties(self) -> dict[str, str]:
        """The Delta properties a table is created with (and an overwrite keeps)."""
        return {"delta.dataSkippingStatsColumns": ",".join(self.stats)} if self.stats else {}


TABLES: dict[str, TableSpec] = {
    "bronze": TableSpec("bronze/traces", S.BRONZE, S.BRONZE_PARTITIONS, (S.EVENT_DATE, S.POD_ID, S.TS), (S.POD_ID, S.TS),
                        stats=(S.POD_ID, S.TS)),
    "quarantine": TableSpec("bronze/quarantine", S.QUARANTINE, (), ("source_file", "raw_hash", "reason")),
    "silver": TableSpec("silver/windows", S.SILVER, S.SILVER_PARTITIONS, (), (S.POD_ID, S.TS),
                        stats=(S.POD_ID, S.TS)),
    # key: the stream appends phases with an insert-only MERGE on it (the label stage replaces the table).
    "phases": TableSpec("silver/phases", S.PHASES, S.PHASES_PARTITIONS, (S.POD_ID, S.TS), (S.POD_ID, S.TS),
                        stats=(S.POD_ID, S.TS, "phase")),
    "sequences": TableSpec("gold/phase_sequences", S.PHASE_SEQUENCES, (S.SERVICE,), (), (S.POD_ID,)),
    "transitions": TableSpec("gold/phase_transitions", S.TRANSITIONS),
    "phase_stats": TableSpec("gold/phase_stats", S.PHASE_STATS),
    "policy_replay": TableSpec("gold/policy_replay", S.POLICY_REPLAY),
    "policy_frontier": TableSpec("gold/policy_frontier", S.POLICY_FRONTIER),
    "policy_calibration": TableSpec("gold/policy_calibration", S.POLICY_CALIBRATION),
    "policy_ladder": TableSpec("gold/policy_ladder", S.POLICY_LADDER),
    # key: one row per container, replaced by the stream only with a newer sample (see upsert_newer).
    "recommendations": TableSpec("gold/recommendations", S.RECOMMENDATIONS, (), (S.POD_ID,)),
    "run_log": TableSpec("_meta/run_log", S.RUN_LOG),
}

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def is_uri(path: str) -> bool:
    """``hdfs://…``, ``s3a://…``, ``dbfs:/…``: a Hadoop URI, not a local path (a Windows drive is not expected)."""
    return bool(_URI.match(str(path)))


def join_path(root: str, *parts: str) -> str:
    """``root/part/...`` for a URI root (kept as is) or a local one (made absolute): the one place paths join."""
    if is_uri(root):
        return "/".join([str(root).rstrip("/"), *parts])
    return str(Path(root).absolute().joinpath(*parts))


def check_writable(key: str, path: str) -> None:
    """Refuse, before any write, a local folder that cannot be created or written (``key`` names the config
    key in the message). URIs are left to their filesystem: permissions there are the store's business."""
    import os

    if is_uri(path):
        return
    target = Path(path).absolute()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{key}: {path!r} is a file, not a folder")
    probe = target
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {path!r} cannot be written ({probe} is not a writable folder)")


def local_frame(spark: SparkSession, rows: Iterable[tuple], schema: StructType) -> DataFrame:
    """A DataFrame of rows held by the driver, sent to the JVM as one Arrow table.

    ``createDataFrame`` on a list of tuples ships pickled rows that a Python worker unpickles inside a Spark
    task: for the run log's one row that worker costs more than the Delta commit (an append took 0.6 s this
    way, 0.3 s through Arrow, in a warm session). Naive datetimes are UTC, as :func:`utc_now` gives them.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    names = schema.fieldNames()
    table = pa.Table.from_pylist([dict(zip(names, row)) for row in rows], schema=to_arrow_schema(schema))
    return spark.createDataFrame(table, schema)


class Tally:
    """Aggregates of a frame taken by the job that consumes it (Spark's ``Observation``), not by reading back.

    A stage reports how many rows it read and wrote; counting the table it just wrote (or the one it read) is
    another Spark job and, in a fresh process, another cold code path: 3.5 s of a 34 s ``ai4dl window`` here.
    ``Tally(df, rows=F.count(F.lit(1)))`` returns the frame to write (``.frame``); after the write,
    :meth:`values` gives the aggregates, or None when Spark did not report them (then count as before: a
    caller never waits on a job that did not run, nor trusts figures it did not get).
    """

    def __init__(self, df: DataFrame, **aggregates: Any) -> None:
        from pyspark.sql import Observation

        self._observation = Observation(f"ai4dl_tally_{uuid.uuid4().hex[:12]}")
        self._names = tuple(aggregates)
        self.frame = df.observe(self._observation, *[agg.alias(name) for name, agg in aggregates.items()])

    def values(self) -> dict[str, Any] | None:
        observation = self._observation
        try:
            java = getattr(observation, "_jo", None)
            if java is not None and java.getRowOrEmpty().isEmpty():  # classic Spark: waits 100 ms at most
                return None
            got = dict(observation.get)  # Spark Connect: {} until its action reported them
        except Exception:  # a session without observed metrics for this plan (or another Observation API)
            return None
        return got if all(name in got for name in self._names) else None


def spec(name: str) -> TableSpec:
    if name not in TABLES:
        raise ConfigError(f"unknown table '{name}' (known: {', '.join(TABLES)})")
    return TABLES[name]


class Lake:
    """All tables of one lake root, by logical name (like ``DeltaTable.forPath``, for the whole lake).

    >>> Lake(None, "s3a://bucket/lake").path("silver")
    's3a://bucket/lake/silver/windows'
    """

    def __init__(self, spark: SparkSession | None, root: str, namespace: str | None = None) -> None:
        self.spark = spark
        self.root = str(root)
        self.namespace = namespace  # ```catalog`.`schema```: tables also named there (see register)

    @classmethod
    def for_config(cls, spark: SparkSession, cfg: Any) -> "Lake":
        """The lake of a job config; one whose names the session's catalog would forget is refused before any
        write (see :meth:`register`)."""
        namespace = cfg.lake.namespace
        if namespace and spark is not None:
            _require_persistent_catalog(spark, namespace)
        return cls(spark, cfg.lake.root, namespace)

    def with_session(self, spark: SparkSession) -> "Lake":
        """The same lake through another session (a streaming batch's clone of the caller's)."""
        return Lake(spark, self.root, self.namespace)

    def path(self, name: str) -> str:
        return join_path(self.root, spec(name).path)

    def table(self, name: str) -> str:
        """The table's name in SQL: ```catalog`.`schema`.`gold_phase_stats``` when the lake has a namespace,
        else ``delta.`<path>```: either is usable in ``spark.sql`` and in a view."""
        if self.namespace:
            return f"{self.namespace}.`{spec(name).table_name}`"
        return delta_table(self.path(name))

    def register(self, name: str) -> None:
        """Name an existing table in the lake's namespace: an external Delta table at its path (``CREATE TABLE
        IF NOT EXISTS ... USING DELTA LOCATION``), so SQL users and BI tools find it by name while every job keeps
        using the path. A name already taken by a table at another location is refused, never repointed. Done
        once per table per Spark application; a lake without a namespace does nothing."""
        if not self.namespace or self.spark is None:
            return
        app = self.spark.sparkContext.applicationId  # the catalog is shared by every session of one application
        key = (app, self.namespace, name, self.path(name))
        if key in _REGISTERED:
            return
        _require_persistent_catalog(self.spark, self.namespace)
        if (app, self.namespace) not in _REGISTERED:
            self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {self.namespace}")
            _REGISTERED.add((app, self.namespace))
        qualified, path = self.table(name), self.path(name)
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {qualified} USING DELTA LOCATION {_sql_string(path)}")
        location = self.spark.sql(f"DESCRIBE DETAIL {qualified}").select("location").first()[0]
        if _same_location(location, path) is False:
            raise ConfigError(f"catalog table {qualified} is at {location}, not at the lake's {path}: drop it or "
                              "choose another lake.schema (ai4dl never repoints a name)")
        _REGISTERED.add(key)

    def exists(self, name: str) -> bool:
        return exists(self.spark, self.path(name))

    def read(self, name: str, version: int | None = None) -> DataFrame:
        """The table's newest data, or the data of commit ``version``."""
        path = self.path(name)
        if not exists(self.spark, path):
            raise MissingTableError(f"table '{name}' does not exist yet at {path}; run the stage that writes it first")
        reader = self.spark.read.format("delta")
        return (reader if version is None else reader.option("versionAsOf", int(version))).load(path)

    def commit(self, name: str) -> tuple[int, str] | None:
        """The newest commit of a table as ``(version, timestamp)``: a version alone does not name data, as a
        table deleted and written again starts its versions over. None when the table does not exist."""
        from delta.tables import DeltaTable

        if not self.exists(name):
            return None
        row = DeltaTable.forPath(self.spark, self.path(name)).history(1).select("version", "timestamp").first()
        return int(row["version"]), str(row["timestamp"])

    def count(self, name: str) -> int:
        return self.read(name).count()

    def overwrite(self, name: str, df: DataFrame, properties: dict[str, str] | None = None) -> "Written":
        s = spec(name)
        written = overwrite(df, self.path(name), s.schema, s.partition_by, {**s.table_properties, **(properties or {})})
        self.register(name)
        return written

    def merge_new(self, name: str, df: DataFrame, *, target_filter: str | None = None, create: bool = True,
                  record_version: bool = True) -> "MergeOutcome":
        s = spec(name)
        outcome = merge_new(df, self.path(name), s.schema, list(s.key), s.partition_by, target_filter=target_filter,
                            create=create, record_version=record_version, properties=s.table_properties)
        self.register(name)
        return outcome

    def upsert_newer(self, name: str, df: DataFrame, order: str, *, create: bool = True) -> "MergeOutcome":
        s = spec(name)
        outcome = upsert_newer(df, self.path(name), s.schema, list(s.key), order, s.partition_by, create=create,
                               properties=s.table_properties)
        self.register(name)
        return outcome

    def ensure(self, name: str) -> None:
        """Create the table (declared schema, partitioning, properties) unless it exists."""
        s = spec(name)
        ensure_table(self.spark, self.path(name), s.schema, s.partition_by, s.table_properties)
        self.register(name)

    def properties(self, name: str) -> dict[str, str]:
        return properties(self.spark, self.path(name))

    def version(self, name: str) -> int | None:
        return version(self.spark, self.path(name))

    def optimize(self, name: str) -> dict[str, Any]:
        return optimize(self.spark, self.path(name), spec(name).zorder)

    def log_run(self, job: str, written: dict[str, int | None], config_digest: str,
                versions: dict[str, int | None] | None = None, run_id: str | None = None,
                started_at: datetime | None = None) -> str:
        return log_run(self, job, written, config_digest, versions, run_id, started_at)


# (application, namespace[, table, path]) already created or checked in this process: registering is idempotent, but
# each check is a catalog call and a Delta snapshot, paid once per table, not once per write.
_REGISTERED: set[tuple] = set()


def delta_table(path: str) -> str:
    """The SQL reference of a Delta table by its path: ``delta.`<path>```."""
    return "delta.`" + str(path).replace("`", "``") + "`"


def _same_location(location: str | None, path: str) -> bool | None:
    """Whether a catalog's location is the lake's path (``file:/x`` is ``/x``); None when it cannot tell.

    >>> _same_location("file:///tmp/lake/gold/x/", "/tmp/lake/gold/x"), _same_location("s3://b/l", "s3a://b/l")
    (True, True)
    """
    if not location:
        return None

    def norm(p: str) -> str:
        p = str(p).rstrip("/")
        if p.startswith("file:"):
            return "/" + p[len("file:"):].lstrip("/")
        return re.sub(r"^s3[an]://", "s3://", p)  # Hadoop's S3 schemes name the same object as s3://

    return norm(location) == norm(path)


def _require_persistent_catalog(spark: SparkSession, namespace: str) -> None:
    """Named tables in a catalog that forgets them at the session's end would be a silent loss: refuse."""
    parts = namespace.split("`.`")
    catalog = parts[0].strip("`") if len(parts) > 1 else "spark_catalog"
    implementation = spark.conf.get("spark.sql.catalogImplementation", "in-memory")
    if implementation == "in-memory" and catalog == "spark_catalog":  # another catalog (Unity's) keeps its own
        raise ConfigError(
            f"lake.schema: this Spark session's catalog is in-memory, so the names in {namespace} would vanish with "
            "it; let ai4dl start the session (it enables a persistent catalog), or start it with enableHiveSupport()"
        )


def exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def version(spark: SparkSession, path: str) -> int | None:
    from delta.tables import DeltaTable

    if not exists(spark, path):
        return None
    return DeltaTable.forPath(spark, path).history(1).select("version").first()[0]


def ensure_table(
    spark: SparkSession,
    path: str,
    schema: StructType,
    partition_by: Iterable[str] = (),
    properties: dict[str, str] | None = None,
) -> bool:
    """Create the table with its declared schema (NOT NULL columns enforced by Delta) unless it exists; True when
    this call created it.

    ``properties`` go into the creating commit itself, so a new table never exists without them.
    """
    from delta.tables import DeltaTable

    if exists(spark, path):
        return False
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    parts = list(partition_by)
    if parts:
        builder = builder.partitionedBy(*parts)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    for attempt in range(MERGE_RETRIES):
        try:
            builder.execute()
            return True
        except Exception:
            # Another writer creating the table at the same moment makes ours fail (Delta sees a log
            # directory without a first commit, or loses the race for version 0): fine once the table exists.
            for _ in range(10):
                if exists(spark, path):
                    return False
                time.sleep(0.3)
            if attempt == MERGE_RETRIES - 1:
                raise
            # Still no table after the wait: a creator killed before its first commit left a log directory
            # without any commit, which Delta then refuses to create over. Nothing was ever committed there.
            _clear_uncommitted_log(spark, path)


def _delta_log(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``<path>/_delta_log`` as a Hadoop path and its file system, through the session's Hadoop configuration
    (as Delta's: credentials set on the session included)."""
    log = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(join_path(path, "_delta_log"))
    return log, log.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())


def _has_log_directory(spark: SparkSession, path: str) -> bool:
    """Whether ``<path>/_delta_log`` exists: one file-system call, no Delta snapshot; False when the file system
    cannot say."""
    try:
        log, fs = _delta_log(spark, path)
        return bool(fs.exists(log))
    except Exception:  # noqa: BLE001 - then the full check decides
        return False


def _clear_uncommitted_log(spark: SparkSession, path: str) -> bool:
    """Remove ``<path>/_delta_log`` when it holds no commit file (an interrupted create); True if removed."""
    log, fs = _delta_log(spark, path)
    if not fs.exists(log):
        return False
    names = [s.getPath().getName() for s in fs.listStatus(log)]
    if any(n.endswith(".json") or ".checkpoint" in n for n in names):
        return False
    return bool(fs.delete(log, True))


# The overwrite commit carries the table properties it was written with in its commitInfo.userMetadata.
USER_METADATA_PROPERTIES = "ai4dl.properties"
# Operations after which the table's own metadata (TBLPROPERTIES) is authoritative again.
_METADATA_OPERATIONS = {"SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "CREATE OR REPLACE TABLE", "REPLACE TABLE"}
_HISTORY_SCAN = 50


@dataclass(frozen=True)
class Written:
    """What one overwrite committed, from the commit's own metrics: the table's version after it and its rows
    (``rows`` None when another kind of commit came in between: then count the table)."""

    version: int | None
    rows: int | None


def overwrite(
    df: DataFrame,
    path: str,
    schema: StructType,
    partition_by: Iterable[str] = (),
    properties: dict[str, str] | None = None,
) -> Written:
    """Replace a table's contents in one Delta commit: readers see the old version or the new one, never half.

    Returns the version and row count of that commit, read from its history entry (Delta records
    ``numOutputRows``), so a stage does not count again what it just wrote.

    Table properties (e.g. silver's scaler) must never disagree with the data a reader gets, even when the job
    is killed between two commits. Delta cannot change TBLPROPERTIES and data in one DataFrame write without
    dropping the declared NOT NULL schema, so:

    - a new table is created with its properties in the creating commit (an interrupted first run leaves an
      empty table carrying them, which is consistent);
    - the data commit itself records the properties in its ``userMetadata``: it is atomic with the data;
    - the ``ALTER TABLE ... SET TBLPROPERTIES`` that follows is skipped when the properties are unchanged
      (the usual rerun) or the table was created by this call with them, so then the whole job is exactly
      one commit (two on a new table);
    - :func:`properties` resolves the properties of the newest data commit over a stale ALTER, so a job killed
      after the data commit but before the ALTER still presents the new data with the new properties, and one
      killed before the data commit presents the old data with the old ones.

    Files written by an interrupted job are not part of any version (the log commit is atomic); ``VACUUM``
    removes them.
    """
    spark = df.sparkSession
    props = {str(k): str(v) for k, v in (properties or {}).items()}
    _upgrade_schema(spark, path, schema, partition_by, props)
    created = ensure_table(spark, path, schema, partition_by, props)
    writer = df.select(*schema.fieldNames()).write.format("delta").mode("overwrite")
    if props:
        meta = {**session_commit_info(spark), USER_METADATA_PROPERTIES: props}  # the run's tag kept
        writer = writer.option("userMetadata", json.dumps(meta, sort_keys=True))
    writer.save(path)
    written = _last_write(spark, path)
    if props and not created:  # a table created just now carries them from its first commit
        current = table_properties(spark, path)
        if any(current.get(k) != v for k, v in props.items()):
            set_properties(spark, path, props)
            written = Written(version(spark, path), written.rows)
    return written


def _last_write(spark: SparkSession, path: str) -> Written:
    """The newest commit's version and, when it is a whole-table overwrite (ours, or a writer's that replaced
    ours since: either way the table's rows), the rows it wrote."""
    from delta.tables import DeltaTable

    row = (DeltaTable.forPath(spark, path).history(1)
           .select("version", "operation", "operationParameters", "operationMetrics").first())
    metrics, params = row["operationMetrics"] or {}, row["operationParameters"] or {}
    whole = row["operation"] == "WRITE" and params.get("mode") == "Overwrite" and not params.get("predicate")
    rows = metrics.get("numOutputRows") if whole else None
    return Written(int(row["version"]), None if rows is None else int(rows))


def _upgrade_schema(spark: SparkSession, path: str, schema: StructType, partition_by: Iterable[str],
                    props: dict[str, str]) -> None:
    """A table written by an older ai4dl with other columns is replaced by an empty one of the declared schema
    (NOT NULL kept), so the overwrite that follows succeeds. Only for tables a stage rewrites whole: the
    previous version stays in the Delta history (time travel), nothing is merged into the old layout."""
    if not exists(spark, path):
        return
    current = spark.read.format("delta").load(path).schema.fieldNames()
    if current == schema.fieldNames():
        return
    cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}" for f in schema.fields)
    parts = f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partition_by)})" if list(partition_by) else ""
    tbl = f" TBLPROPERTIES ({', '.join(f'{_sql_string(k)} = {_sql_string(v)}' for k, v in props.items())})" if props else ""
    spark.sql(f"REPLACE TABLE delta.`{path}` ({cols}) USING DELTA{parts}{tbl}")


def _sql_string(value: str) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def set_properties(spark: SparkSession, path: str, properties: dict[str, str]) -> None:
    props = ", ".join(f"{_sql_string(k)} = {_sql_string(v)}" for k, v in properties.items())
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({props})")


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's TBLPROPERTIES as stored in its current metadata.

    ``SHOW TBLPROPERTIES`` reads the metadata alone; ``DeltaTable.detail()`` (the same properties) also sizes
    every file of the table, a Spark job: 3 s against 0.1 s per call on the demo's lake. SHOW adds the
    protocol (reader/writer versions, table features), which is not a property of the data and is left out.
    """
    rows = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    return {str(r[0]): str(r[1]) for r in rows if not _is_protocol_key(str(r[0]))}


def _is_protocol_key(key: str) -> bool:
    return key in ("delta.minReaderVersion", "delta.minWriterVersion") or key.startswith("delta.feature.")


def _metadata_properties(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    try:
        meta = json.loads(text)
    except ValueError:
        return None
    if isinstance(meta, dict) and isinstance(meta.get(USER_METADATA_PROPERTIES), dict):
        return {str(k): str(v) for k, v in meta[USER_METADATA_PROPERTIES].items()}
    return None


def properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The properties belonging to the table's current data (see :func:`overwrite` for the guarantee).

    The newest commit that either wrote data with recorded properties or changed the metadata decides: the
    recorded properties overlay the table's own in the first case.
    """
    from delta.tables import DeltaTable

    current = table_properties(spark, path)
    history = DeltaTable.forPath(spark, path).history(_HISTORY_SCAN).select("version", "operation", "userMetadata")
    for row in sorted(history.collect(), key=lambda r: -r["version"]):
        if row["operation"] in _METADATA_OPERATIONS:
            return current
        recorded = _metadata_properties(row["userMetadata"])
        if recorded is not None:
            return {**current, **recorded}
    return current


def _concurrent_exceptions() -> tuple[type[BaseException], ...]:
    """Delta's optimistic-concurrency conflicts as the Python API raises them (delta-spark 4.3)."""
    try:
        from delta import exceptions as dx
    except ImportError:  # pragma: no cover
        return ()
    names = (
        "ConcurrentAppendException",
        "ConcurrentDeleteReadException",
        "ConcurrentDeleteDeleteException",
        "ConcurrentTransactionException",
        "ConcurrentWriteException",
        "DeltaConcurrentModificationException",
        "MetadataChangedException",
        "ProtocolChangedException",
    )
    return tuple(getattr(dx, n) for n in names if isinstance(getattr(dx, n, None), type))


def is_concurrent_conflict(exc: BaseException) -> bool:
    """A commit rejected because another writer committed first (retrying against the new snapshot is safe)."""
    if isinstance(exc, _concurrent_exceptions()):
        return True
    # Raised through py4j without conversion (or by another Delta build): recognise the class / error class.
    text = f"{type(exc).__name__} {str(exc)[:2000]}"
    return "DELTA_CONCURRENT" in text or "ConcurrentAppendException" in text or "DELTA_METADATA_CHANGED" in text \
        or "DELTA_PROTOCOL_CHANGED" in text or "Concurrent" in type(exc).__name__


@dataclass(frozen=True)
class MergeOutcome:
    inserted: int  # rows this MERGE inserted (its own metrics, not other writers')
    version: int | None  # the Delta version it committed (None when nothing was recorded)


def merge_new(
    df: DataFrame, path: str, schema: StructType, key: list[str], partition_by: Iterable[str] = (), *,
    target_filter: str | None = None, create: bool = True, record_version: bool = True,
    properties: dict[str, str] | None = None,
) -> MergeOutcome:
    """Insert the rows of ``df`` whose key is not in the table yet; create the table on first write.

    Delta's MERGE is one atomic commit. When another writer commits first, Delta rejects ours with a
    concurrent-modification exception; an insert-only MERGE re-run against the new snapshot is safe (it re-checks
    every key, so a row the other writer inserted is not inserted twice) and is retried up to
    :data:`MERGE_RETRIES` times. Rows already stored are never rewritten, so a rerun of the same input is a no-op.

    ``target_filter``: a condition on the table's rows (``t.``) that every row sharing a key with ``df`` meets,
    e.g. ``t.ts >= '<the batch's oldest ts>'``: Delta then skips the files outside it (their min/max
    statistics), so a small MERGE into a large table reads what it may match, not the table. ``create=False``
    skips the existence check (the caller made the table); ``properties``: the Delta properties a table created
    here gets; ``record_version=False`` skips reading the history for the version committed (``version`` is then
    None).
    """
    from delta.tables import DeltaTable

    spark = df.sparkSession
    if create:
        ensure_table(spark, path, schema, partition_by, properties)
    df = df.select(*schema.fieldNames())
    cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
    if target_filter:
        cond = f"({target_filter}) AND {cond}"
    token = uuid.uuid4().hex
    conf_key = COMMIT_METADATA_CONF
    previous = spark.conf.get(conf_key, None)
    spark.conf.set(conf_key, json.dumps({**session_commit_info(spark), "ai4dl.commit": token}, sort_keys=True))
    try:
        for attempt in range(MERGE_RETRIES):
            try:
                metrics = DeltaTable.forPath(spark, path).alias("t").merge(df.alias("s"), cond).whenNotMatchedInsertAll().execute()
                break
            except Exception as exc:
                if not is_concurrent_conflict(exc) or attempt == MERGE_RETRIES - 1:
                    raise
                time.sleep(0.5 * (attempt + 1) + (uuid.uuid4().int % 500) / 1000)
    finally:
        if previous is None:
            spark.conf.unset(conf_key)
        else:
            spark.conf.set(conf_key, previous)
    row = metrics.first() if metrics is not None else None
    inserted = int(row["num_inserted_rows"]) if row is not None and "num_inserted_rows" in row.asDict() else 0
    return MergeOutcome(inserted=inserted, version=_committed_version(spark, path, token) if record_version else None)


def upsert_newer(
    df: DataFrame, path: str, schema: StructType, key: list[str], order: str, partition_by: Iterable[str] = (), *,
    create: bool = True, properties: dict[str, str] | None = None,
) -> MergeOutcome:
    """One row per ``key``: insert a new key, replace a stored row only by one whose ``order`` column is greater.

    For tables that hold the latest state of something (the live recommendation per container): a batch
    replayed after a crash carries the same ``order`` values as the rows it already wrote, so it changes
    nothing, and an older row never overwrites a newer one. One atomic MERGE commit, retried on concurrent
    conflicts like :func:`merge_new`. ``df`` must hold at most one row per key.
    """
    from delta.tables import DeltaTable

    spark = df.sparkSession
    if create:
        ensure_table(spark, path, schema, partition_by, properties)
    df = df.select(*schema.fieldNames())
    cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
    for attempt in range(MERGE_RETRIES):
        try:
            metrics = (
                DeltaTable.forPath(spark, path).alias("t").merge(df.alias("s"), cond)
                .whenMatchedUpdateAll(condition=f"s.`{order}` > t.`{order}`")
                .whenNotMatchedInsertAll()
                .execute()
            )
            break
        except Exception as exc:
            if not is_concurrent_conflict(exc) or attempt == MERGE_RETRIES - 1:
                raise
            time.sleep(0.5 * (attempt + 1) + (uuid.uuid4().int % 500) / 1000)
    row = metrics.first() if metrics is not None else None
    values = row.asDict() if row is not None else {}
    changed = int(values.get("num_inserted_rows", 0) or 0) + int(values.get("num_updated_rows", 0) or 0)
    return MergeOutcome(inserted=changed, version=None)


def _committed_version(spark: SparkSession, path: str, token: str) -> int | None:
    from delta.tables import DeltaTable

    rows = DeltaTable.forPath(spark, path).history(_HISTORY_SCAN).select("version", "userMetadata").collect()
    for r in rows:
        if r["userMetadata"] and token in r["userMetadata"]:
            return int(r["version"])
    return None  # a MERGE with nothing to insert may commit nothing


def optimize(spark: SparkSession, path: str, zorder: Iterable[str] = ()) -> dict[str, Any]:
    """Compact a table's small files (Delta OPTIMIZE), Z-ordered by ``zorder`` when given; returns the metrics.

    Partitioning (service, event date) already lets a query for one service or one day skip the rest of the
    fleet; OPTIMIZE keeps the number of files per partition small after many incremental ingests, and Z-order
    keeps one container's rows in few files (Delta's per-file min/max statistics skip the others).
    """
    from delta.tables import DeltaTable

    if not exists(spark, path):
        return {}
    builder = DeltaTable.forPath(spark, path).optimize()
    cols = tuple(zorder)
    result = builder.executeZOrderBy(*cols) if cols else builder.executeCompaction()
    metrics = result.select("metrics.numFilesAdded", "metrics.numFilesRemoved").first()
    return {"files_added": metrics[0], "files_removed": metrics[1]}


# Every command appends to the run log twice; only `ai4dl log` reads it. Delta's default, a checkpoint every 10
# commits, made every fifth command pay for one (8-9 s in a fresh JVM, its first checkpoint; 0.5 s for an
# append): at 100, one command in fifty does, and reading the log replays at most 100 small JSON commits.
RUN_LOG_PROPERTIES = {"delta.checkpointInterval": "100"}


# (Spark application, run-log path) checked in this process: a process running several stages (`ai4dl run`,
# the demo, a notebook) checks its run log's schema once, not once per stage (each check is a table lookup and a
# snapshot, 0.3-0.5 s in a cold JVM); later rows only look for its log directory (a file-system call), so a run
# log deleted meanwhile is created again with its schema. A failed append forgets the check.
_RUN_LOGS_CHECKED: set[tuple[str, str]] = set()


def _run_log_key(lake: Lake) -> tuple[str, str]:
    return lake.spark.sparkContext.applicationId, lake.path("run_log")


def _ensure_run_log(lake: Lake, key: tuple[str, str]) -> str:
    """The run-log table, created or brought to the current schema (a lake of ai4dl 0.1 lacks status columns),
    once per Spark application and path (``key``, :data:`_RUN_LOGS_CHECKED`); named in the lake's namespace
    every time (a set lookup once done: :meth:`Lake.register`)."""
    spark, path = lake.spark, lake.path("run_log")
    if key in _RUN_LOGS_CHECKED and _has_log_directory(spark, path):
        lake.register("run_log")
        return path
    created = ensure_table(spark, path, S.RUN_LOG, properties=RUN_LOG_PROPERTIES)
    lake.register("run_log")
    have = set(S.RUN_LOG.fieldNames() if created else spark.read.format("delta").load(path).columns)
    missing = [f for f in S.RUN_LOG.fields if f.name not in have]
    if missing:
        cols = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({cols})")
        spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN finished_at DROP NOT NULL")
    _RUN_LOGS_CHECKED.add(key)
    return path


def _append_run_log(lake: Lake, rows: list[tuple]) -> None:
    key = _run_log_key(lake)
    path = _ensure_run_log(lake, key)
    frame = local_frame(lake.spark, rows, S.RUN_LOG)
    for attempt in range(MERGE_RETRIES):  # appends never conflict with appends, but be safe with a concurrent create
        try:
            frame.write.format("delta").mode("append").save(path)
            return
        except Exception as exc:
            _RUN_LOGS_CHECKED.discard(key)  # whatever went wrong, the next row checks the table again
            if not is_concurrent_conflict(exc) or attempt == MERGE_RETRIES - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def log_started(lake: Lake, run_id: str, job: str, config_digest: str, started_at: datetime) -> None:
    """The "started" row, written before the run commits anything: a run that dies leaves this row alone."""
    _append_run_log(lake, [(run_id, job, "-", None, None, config_digest, None, "started", started_at, None)])


def log_failed(lake: Lake, run_id: str, job: str, config_digest: str, started_at: datetime, message: str) -> None:
    """The "failed" row of a run that raised: its one-line error."""
    _append_run_log(lake, [(run_id, job, "-", None, None, config_digest, utc_now(), "failed", started_at, message[:2000])])


def log_event(lake: Lake, run_id: str, job: str, config_digest: str, started_at: datetime, status: str,
              message: str) -> None:
    """A row of a running job that is neither its start nor its end, e.g. the stream switching to a new model
    (status ``model``): what happened and when, in the same log as the run itself."""
    _append_run_log(lake, [(run_id, job, "-", None, None, config_digest, utc_now(), status, started_at, message[:2000])])


def log_run(
    lake: Lake,
    job: str,
    written: dict[str, int | None],
    config_digest: str,
    versions: dict[str, int | None] | None = None,
    run_id: str | None = None,
    started_at: datetime | None = None,
) -> str:
    """Append what a run wrote (table, Delta version, rows) as "finished" rows; returns the run id.

    ``versions`` gives the exact versions a job committed (e.g. from :func:`merge_new`); otherwise the table's
    current version is recorded. A name that is not a lake table (e.g. a model directory) is logged as is,
    without a Delta version. A run that wrote nothing still leaves one row (table ``-``), so every run shows.
    """
    run_id = run_id or new_run_id()
    now = utc_now()
    versions = versions or {}
    rows = []
    for name, n in (written or {"-": None}).items():
        if name in versions:
            v = versions[name]
        elif name in TABLES:
            v = lake.version(name)
        else:
            v = None
        rows.append((run_id, job, name, None if v is None else int(v), None if n is None else int(n), config_digest,
                     now, "finished", started_at or now, None))
    _append_run_log(lake, rows)
    return run_id


COMMIT_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
RUN_ID_KEY = "ai4dl.run_id"


def session_commit_info(spark: SparkSession) -> dict[str, Any]:
    """The JSON the session stamps on every Delta commit (``commitInfo.userMetadata``), as a dict."""
    text = spark.conf.get(COMMIT_METADATA_CONF, None)
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@contextmanager
def commits_tagged(spark: SparkSession, run_id: str):
    """Every Delta commit made inside carries ``{"ai4dl.run_id": run_id}`` in its userMetadata, so a version
    committed by a run that then died is recognisable in the table's history (see ``ai4dl log``)."""
    previous = spark.conf.get(COMMIT_METADATA_CONF, None)
    spark.conf.set(COMMIT_METADATA_CONF, json.dumps({**session_commit_info(spark), RUN_ID_KEY: run_id}, sort_keys=True))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(COMMIT_METADATA_CONF)
        else:
            spark.conf.set(COMMIT_METADATA_CONF, previous)


def commit_run_ids(lake: Lake, name: str, limit: int = _HISTORY_SCAN) -> dict[int, str]:
    """Delta version -> the ai4dl run that committed it, for a table's recent history."""
    from delta.tables import DeltaTable

    if not lake.exists(name):
        return {}
    out = {}
    for r in DeltaTable.forPath(lake.spark, lake.path(name)).history(limit).select("version", "userMetadata").collect():
        try:
            meta = json.loads(r["userMetadata"]) if r["userMetadata"] else {}
        except ValueError:
            continue
        if isinstance(meta, dict) and RUN_ID_KEY in meta:
            out[int(r["version"])] = str(meta[RUN_ID_KEY])
    return out


def run_history(lake: Lake, last: int = 20) -> "Any":
    """The last ``last`` runs, newest first, one row each (pandas): ``run_id, job, status, started_at,
    finished_at, written, message``. ``status`` is ``finished``, ``failed``, or ``unfinished`` for a run with a
    "started" row and nothing after it (still running, or killed); rows of ai4dl 0.1 count as finished."""
    import pandas as pd

    columns = ["run_id", "job", "status", "started_at", "finished_at", "written", "message"]
    if not lake.exists("run_log"):
        return pd.DataFrame(columns=columns)
    log = lake.read("run_log").toPandas()
    if "status" not in log:
        log["status"], log["started_at"], log["message"] = None, log["finished_at"], None
    log["status"] = log["status"].fillna("finished")
    out = []
    for run_id, rows in log.groupby("run_id", sort=False):
        statuses = set(rows["status"])
        status = "failed" if "failed" in statuses else "finished" if "finished" in statuses else "unfinished"
        done = rows[rows["status"] == "finished"]
        written = ", ".join(
            f"{r.table}@v{int(r.delta_version)}" if pd.notna(r.delta_version) else str(r.table)
            for r in done.itertuples() if r.table != "-"
        )
        message = rows["message"].dropna()
        out.append({
            "run_id": run_id, "job": rows["job"].iloc[0], "status": status,
            "started_at": rows["started_at"].min(), "finished_at": rows["finished_at"].max(),
            "written": written, "message": message.iloc[0] if len(message) else None,
        })
    frame = pd.DataFrame(out, columns=columns).sort_values("started_at", ascending=False, na_position="last")
    return frame.head(last).reset_index(drop=True)


def orphan_commits(lake: Lake) -> list[tuple[str, int, str]]:
    """``(table, version, run_id)`` of recent commits made by runs that never logged "finished": what a killed
    run left behind (the data is a complete Delta version; the run log just never recorded it)."""
    if not lake.exists("run_log"):
        return []
    log = lake.read("run_log")
    if "status" not in log.columns:
        return []
    finished = {r[0] for r in log.where("status = 'finished' OR status IS NULL").select("run_id").distinct().collect()}
    out = []
    for name in TABLES:
        if name == "run_log":
            continue
        for v, run_id in sorted(commit_run_ids(lake, name).items()):
            if run_id not in finished:
                out.append((name, v, run_id))
    return out

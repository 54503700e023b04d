"""Where each table lives, and the Delta writes every job shares: atomic overwrite, MERGE on a key, run log.

Tables are addressed by path (``<lake.root>/<layer>/<name>``) so the same job runs on local disk, HDFS, S3 or
DBFS; :func:`register_views` puts SQL names on them for BI tools.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from pyspark.sql import DataFrame, SparkSession

from pyspark.sql.types import StructType

from ai4dl.schema import RUN_LOG

MERGE_RETRIES = 6

TABLES = {
    "bronze": "bronze/traces",
    "quarantine": "bronze/quarantine",
    "silver": "silver/windows",
    "phases": "silver/phases",
    "sequences": "gold/phase_sequences",
    "transitions": "gold/phase_transitions",
    "phase_stats": "gold/phase_stats",
    "policy_replay": "gold/policy_replay",
    "run_log": "_meta/run_log",
}


def table_path(cfg: dict[str, Any], name: str) -> str:
    """Path of a lake table by its logical name (see :data:`TABLES`)."""
    root = cfg["lake"]["root"]
    rel = TABLES[name]
    if "://" in root:
        return f"{root.rstrip('/')}/{rel}"
    return str(Path(root).absolute() / rel)


def exists(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, path)


def read(spark: SparkSession, cfg: dict[str, Any], name: str) -> DataFrame:
    path = table_path(cfg, name)
    if not exists(spark, path):
        raise FileNotFoundError(f"table '{name}' does not exist yet at {path}; run the job that writes it first")
    return spark.read.format("delta").load(path)


def version(spark: SparkSession, path: str) -> int | None:
    from delta.tables import DeltaTable

    if not exists(spark, path):
        return None
    return DeltaTable.forPath(spark, path).history(1).select("version").first()[0]


def ensure_table(spark: SparkSession, path: str, schema: StructType, partition_by: Iterable[str] = ()) -> None:
    """Create the table with its declared schema (NOT NULL columns enforced by Delta) unless it exists."""
    from delta.tables import DeltaTable

    if exists(spark, path):
        return
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    parts = list(partition_by)
    if parts:
        builder = builder.partitionedBy(*parts)
    try:
        builder.execute()
    except Exception:
        if not exists(spark, path):  # a concurrent writer creating it is fine; anything else is not
            raise


def overwrite(
    df: DataFrame,
    path: str,
    schema: StructType,
    partition_by: Iterable[str] = (),
    properties: dict[str, str] | None = None,
) -> None:
    """Replace a table's contents in one Delta commit: readers see the old version or the new one, never half."""
    spark = df.sparkSession
    ensure_table(spark, path, schema, partition_by)
    df.select(*schema.fieldNames()).write.format("delta").mode("overwrite").save(path)
    if properties:
        set_properties(spark, path, properties)


def set_properties(spark: SparkSession, path: str, properties: dict[str, str]) -> None:
    props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({props})")


def properties(spark: SparkSession, path: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().select("properties").first()
    return dict(detail[0] or {})


def merge_new(df: DataFrame, path: str, schema: StructType, key: list[str], partition_by: Iterable[str] = ()) -> None:
    """Insert the rows of ``df`` whose key is not in the table yet; create the table on first write.

    Delta's MERGE is one atomic commit and retried by the caller on a concurrent-append conflict; rows already
    stored are never rewritten, so a rerun of the same input is a no-op.
    """
    from delta.tables import DeltaTable

    spark = df.sparkSession
    ensure_table(spark, path, schema, partition_by)
    df = df.select(*schema.fieldNames())
    cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)
    for attempt in range(MERGE_RETRIES):
        try:
            DeltaTable.forPath(spark, path).alias("t").merge(df.alias("s"), cond).whenNotMatchedInsertAll().execute()
            return
        except Exception as exc:
            # Two ingests into one table: Delta's optimistic concurrency rejects the later commit; an
            # insert-only MERGE re-run against the new snapshot is safe (it re-checks every key).
            if "Concurrent" not in type(exc).__name__ and "DELTA_CONCURRENT" not in str(exc):
                raise
            if attempt == MERGE_RETRIES - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


# Z-order columns per table: rows of one container sit together inside each partition, so a query for one
# pod (or a time range of it) reads few files thanks to Delta's per-file min/max statistics.
ZORDER = {
    "bronze": ("pod_id", "ts"),
    "silver": ("pod_id", "ts"),
    "phases": ("pod_id", "ts"),
    "sequences": ("pod_id",),
}


def optimize(spark: SparkSession, cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """Compact a table's small files (Delta OPTIMIZE), Z-ordered where :data:`ZORDER` says; returns the metrics.

    Partitioning (service, event date) already lets a query for one service or one day skip the rest of the
    fleet; OPTIMIZE keeps the number of files per partition small after many incremental ingests.
    """
    from delta.tables import DeltaTable

    path = table_path(cfg, name)
    if not exists(spark, path):
        return {}
    builder = DeltaTable.forPath(spark, path).optimize()
    result = builder.executeZOrderBy(*ZORDER[name]) if name in ZORDER else builder.executeCompaction()
    metrics = result.select("metrics.numFilesAdded", "metrics.numFilesRemoved").first()
    return {"files_added": metrics[0], "files_removed": metrics[1]}


def log_run(spark: SparkSession, cfg: dict[str, Any], job: str, written: dict[str, int], config_digest: str) -> None:
    """Append what a job wrote (table, Delta version, rows) to the run-log table."""
    run_id = uuid.uuid4().hex[:12]
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    rows = [
        (run_id, job, name, version(spark, table_path(cfg, name)), int(n), config_digest, now)
        for name, n in written.items()
    ]
    path = table_path(cfg, "run_log")
    ensure_table(spark, path, RUN_LOG)
    spark.createDataFrame(rows, RUN_LOG).write.format("delta").mode("append").save(path)

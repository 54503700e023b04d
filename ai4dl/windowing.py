"""Sliding windows: each container step with its ``n_history`` previous steps, scaled, as one silver row.

Ordering and irregular sampling, deterministically:
- steps of a container are ordered by ``ts`` (arrival order does not matter; bronze holds one row per
  ``(pod_id, ts)``), ``step`` is the 0-based position in that order;
- the history of a step is the ``n_history`` samples before it, however far apart (this is what the original
  AI4DL tool did); with ``max_gap_seconds`` set, a longer gap starts a new ``segment`` and the history
  restarts there, so a window never spans an outage;
- steps with fewer than ``n_history`` predecessors in their segment are kept with ``has_full_history`` false and
  a null ``history``: they get a null phase later, never a fake one.

All of it is Spark window functions over ``partitionBy(pod_id)``: nothing is collected to the driver.
"""

from __future__ import annotations

from typing import Any, Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ai4dl import lake
from ai4dl.scaler import Scaler
from ai4dl.schema import BEHAVIOUR, POD_ID, SILVER, SILVER_PARTITIONS, TS

PROP_SCALER = "ai4dl.scaler"
PROP_HISTORY = "ai4dl.n_history"
PROP_FEATURES = "ai4dl.features"


def is_training_container(pod_id: Column, fraction: float, seed: int) -> Column:
    """Deterministic container split by a hash of the id: the same containers train on every run and machine."""
    return (F.pmod(F.xxhash64(pod_id, F.lit(seed)), F.lit(10_000)) < F.lit(int(round(fraction * 10_000))))


def build_windows(bronze: DataFrame, scaler: Scaler, n_history: int, max_gap_seconds: float | None = None) -> DataFrame:
    """Silver rows (schema :data:`ai4dl.schema.SILVER`) from bronze rows."""
    if n_history < 1:
        raise ValueError(f"n_history must be at least 1, got {n_history}")
    missing = [f for f in scaler.features if f not in bronze.columns]
    if missing:
        raise ValueError(f"bronze lacks the scaler's feature column(s): {', '.join(missing)}")
    by_pod = Window.partitionBy(POD_ID).orderBy(TS)
    df = bronze.withColumn("features", F.array(*scaler.columns()))
    df = df.withColumn("step", (F.row_number().over(by_pod) - 1).cast("int"))
    if max_gap_seconds:
        gap = F.col(TS).cast("double") - F.lag(F.col(TS).cast("double")).over(by_pod)
        df = df.withColumn("_new", F.when(gap > F.lit(float(max_gap_seconds)), 1).otherwise(0))
        df = df.withColumn("segment", F.sum("_new").over(by_pod.rowsBetween(Window.unboundedPreceding, 0)).cast("int"))
    else:
        df = df.withColumn("segment", F.lit(0))
    by_segment = Window.partitionBy(POD_ID, "segment").orderBy(TS)
    lags = [F.lag("features", i).over(by_segment) for i in range(n_history, 0, -1)]  # oldest first
    df = df.withColumn("history", F.concat(*lags))  # null unless every lag exists
    df = df.withColumn("has_full_history", F.col("history").isNotNull())
    if BEHAVIOUR not in df.columns:
        df = df.withColumn(BEHAVIOUR, F.lit(None).cast("string"))
    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in SILVER.fields])


def silver_scaler(spark: SparkSession, path: str) -> tuple[Scaler, int]:
    """The scaler and history length a silver table was built with (stored in its table properties)."""
    props = lake.properties(spark, path)
    if PROP_SCALER not in props or PROP_HISTORY not in props:
        raise ValueError(f"silver table {path} carries no scaler/history properties; rebuild it with the window job")
    return Scaler.from_json(props[PROP_SCALER]), int(props[PROP_HISTORY])


def run_window(spark: SparkSession, cfg: dict[str, Any], scaler: Scaler | None = None) -> dict[str, int]:
    """Bronze -> silver, replacing silver atomically; fits the scaler on training containers unless given one."""
    wcfg = cfg["window"]
    bronze = lake.read(spark, cfg, "bronze")
    features: Sequence[str] = tuple(wcfg["features"])
    if scaler is None:
        train = bronze.where(is_training_container(F.col(POD_ID), wcfg["train_fraction"], wcfg["split_seed"]))
        scaler = Scaler.fit(train, features)
    silver = build_windows(bronze, scaler, int(wcfg["n_history"]), wcfg["max_gap_seconds"])
    path = lake.table_path(cfg, "silver")
    lake.overwrite(
        silver,
        path,
        SILVER,
        partition_by=SILVER_PARTITIONS,
        properties={
            PROP_SCALER: scaler.to_json().replace("\n", ""),
            PROP_HISTORY: str(int(wcfg["n_history"])),
            PROP_FEATURES: ",".join(scaler.features),
        },
    )
    counts = spark.read.format("delta").load(path).groupBy("has_full_history").count().collect()
    by = {r["has_full_history"]: r["count"] for r in counts}
    print(f"silver: {sum(by.values())} windows ({by.get(True, 0)} with full history, {by.get(False, 0)} without) -> {path}")
    return {"silver": sum(by.values())}


__all__ = ["build_windows", "is_training_container", "run_window", "silver_scaler"]

"""Sliding windows: each container step with its ``n_history`` previous steps, scaled, as one silver row.

Ordering and irregular sampling, deterministically:
- steps of a container are ordered by ``ts`` (arrival order does not matter; bronze holds one row per
  ``(pod_id, ts)``), ``step`` is the 0-based position in that order;
- the history of a step is the ``n_history`` samples before it, however far apart (this is what the original
  AI4DL tool did); with ``max_gap_seconds`` set, a longer gap starts a new ``segment`` and the history
  restarts there, so a window never spans an outage;
- steps with fewer than ``n_history`` predecessors in their segment are kept with ``has_full_history`` false and
  a null ``history``: they get a null phase later, never a fake one; so do windows with a feature that is not a
  finite number (a derived share of a zero or unknown limit), whose encoding would be meaningless.

All of it is Spark window functions over ``partitionBy(pod_id)``: nothing is collected to the driver.
"""

from __future__ import annotations

import functools
import operator

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from ai4dl.errors import InputError, MissingTableError
from ai4dl.lake.schema import BEHAVIOUR, METRICS, POD_ID, SERVICE, SILVER, TS
from ai4dl.method.scaler import Scaler

PROP_SCALER = "ai4dl.scaler"
PROP_HISTORY = "ai4dl.n_history"
PROP_FEATURES = "ai4dl.features"


# The bronze columns windows are built from: the key, the metrics (features, derived features' inputs, raw
# demand) and the ground truth. Bronze's bookkeeping (source file, ingest time, event date) is left in the scan:
# the derived features run in Python per container, and what is read is shipped there and back.
WINDOW_INPUTS: tuple[str, ...] = (POD_ID, SERVICE, TS, *METRICS, BEHAVIOUR)


def window_inputs(bronze: DataFrame) -> DataFrame:
    """Bronze narrowed to :data:`WINDOW_INPUTS` (those it has)."""
    return bronze.select(*[c for c in WINDOW_INPUTS if c in bronze.columns])


def build_windows(bronze: DataFrame, scaler: Scaler, n_history: int, max_gap_seconds: float | None = None) -> DataFrame:
    """Silver rows (schema :data:`ai4dl.schema.SILVER`) from bronze rows."""
    if n_history < 1:
        raise InputError(f"n_history must be at least 1, got {n_history}")
    missing = [f for f in scaler.features if f not in bronze.columns]
    if missing:
        raise InputError(f"bronze lacks the scaler's feature column(s): {', '.join(missing)}")
    by_pod = Window.partitionBy(POD_ID).orderBy(TS)
    scaled = scaler.columns()
    df = bronze.withColumn("features", F.array(*scaled))
    # A step is unusable when a feature is not a finite number: tested per step on the scalar columns (compiled),
    # then over the window through the lags of that flag, not by a lambda over every window's array.
    df = df.withColumn("_unusable", functools.reduce(operator.or_, [c.isNull() | F.isnan(c) for c in scaled]))
    df = df.withColumn("step", (F.row_number().over(by_pod) - 1).cast("int"))
    if max_gap_seconds:
        gap = F.col(TS).cast("double") - F.lag(F.col(TS).cast("double")).over(by_pod)
        df = df.withColumn("_new", F.when(gap > F.lit(float(max_gap_seconds)), 1).otherwise(0))
        df = df.withColumn("segment", F.sum("_new").over(by_pod.rowsBetween(Window.unboundedPreceding, 0)).cast("int"))
    else:
        df = df.withColumn("segment", F.lit(0))
    # The history is the n_history rows before the step in the container's order, kept only when the oldest of
    # them is in the step's segment (segments are contiguous in time, so then all of them are): the same rows as
    # lags over (pod_id, segment), without sorting every row a second time for that partitioning.
    lags = [F.lag("features", i).over(by_pod) for i in range(n_history, 0, -1)]  # oldest first
    same_segment = F.lag("segment", n_history).over(by_pod) == F.col("segment")
    df = df.withColumn("history", F.when(same_segment, F.concat(*lags)))  # null unless every lag is in the segment
    unusable = functools.reduce(operator.or_, [F.col("_unusable"), *(F.lag("_unusable", i).over(by_pod) for i in range(1, n_history + 1))])
    df = df.withColumn("has_full_history", F.col("history").isNotNull() & ~F.coalesce(unusable, F.lit(True)))
    if BEHAVIOUR not in df.columns:
        df = df.withColumn(BEHAVIOUR, F.lit(None).cast("string"))
    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in SILVER.fields])


def silver_properties(scaler: Scaler, n_history: int) -> dict[str, str]:
    """The table properties that travel with silver's data: a model is checked against them before labelling."""
    return {
        PROP_SCALER: scaler.to_json().replace("\n", ""),
        PROP_HISTORY: str(int(n_history)),
        PROP_FEATURES: ",".join(scaler.features),
    }


def silver_scaler(props: dict[str, str], where: str = "silver") -> tuple[Scaler, int]:
    """The scaler and history length a silver table was built with (from its table properties)."""
    if PROP_SCALER not in props or PROP_HISTORY not in props:
        raise MissingTableError(f"{where} carries no scaler/history properties; rebuild it with the window stage")
    return Scaler.from_json(props[PROP_SCALER]), int(props[PROP_HISTORY])


__all__ = ["build_windows", "silver_properties", "silver_scaler"]

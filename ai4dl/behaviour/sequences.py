"""From per-step phases to behaviour in Spark: run-length sequences, phase transitions, dwell, path counts.

The AI4DL method reads a container's life as a sequence of *phases* (the CRBM + k-means labels of
:data:`ai4dl.schema.PHASES`). This module turns that per-step labelling into the gold tables and small graphs
that describe how workloads behave:

* :func:`run_lengths` - run-length encode each container's phase sequence in Spark
  (:data:`ai4dl.schema.PHASE_SEQUENCES`), optionally smoothing away runs shorter than ``min_run_steps``;
* :func:`transition_counts` / :func:`dwell_stats` - how often phase *a* is followed by phase *b* (per service:
  :func:`service_transition_counts`), and how long a phase lasts once entered;
* :func:`container_phase_paths` / :func:`path_counts` - each container's sequence of run phases (its *path*)
  and the distinct paths with their counts, input of the prototype tree (:mod:`ai4dl.behaviour.graph`).

Everything fleet-sized stays in Spark; only aggregated results (k x k transitions, k dwell rows, one row per
*distinct* path) are brought to the driver.

Conventions
-----------
* A container is identified by ``(pod_id, service)``; a pod belongs to one service.
* Steps whose ``phase`` is null (no full history yet, e.g. the first ``n_history`` steps of a segment) are
  *ignored*, not treated as a phase: they neither start nor split a run. A null between two equal phases is
  therefore inside that run, and a null between two different phases just sits in the gap between the runs.
* ``duration_steps`` counts the *labelled* steps of a run (nulls excluded), so ``end_step - start_step + 1``
  may exceed it when nulls fall inside the run.
* ``duration_seconds`` is ``end_ts - start_ts`` in seconds: 0 for a one-step run. It is the time between the
  first and the last sample of the run, not that span plus one sampling interval.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ai4dl.behaviour.runs import smooth_runs
from ai4dl.lake.schema import DWELL, PHASE_SEQUENCES, POD_ID, SERVICE, TRANSITIONS, TS

CONTAINER = (POD_ID, SERVICE)


# --------------------------------------------------------------------------------------------------------------
# Spark: sequences, transitions, dwell
# --------------------------------------------------------------------------------------------------------------


def _zero(dtype: T.DataType) -> Column:
    if isinstance(dtype, T.StringType):
        return F.lit("")
    if isinstance(dtype, T.TimestampType):
        return F.lit(datetime(1970, 1, 1)).cast(T.TimestampType())
    if isinstance(dtype, T.DateType):
        return F.lit("1970-01-01").cast(T.DateType())
    if isinstance(dtype, T.BooleanType):
        return F.lit(False)
    return F.lit(0).cast(dtype)


def conform(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Select ``schema``'s columns in order, cast to its types, with its nullability.

    Spark marks every aggregate result nullable; for a required field this wraps the column in
    ``coalesce(col, <typed zero>)``, which only changes the declared nullability: the callers in this package
    only conform columns that are non-null by construction (group keys of required columns, counts, min/max
    of non-empty groups), so the zero is never produced.
    """
    cols = []
    current = {f.name: f for f in df.schema.fields}
    for f in schema.fields:
        c = F.col(f"`{f.name}`")
        if current[f.name].dataType != f.dataType:
            c = c.cast(f.dataType)
        if not f.nullable and current[f.name].nullable:
            c = F.coalesce(c, _zero(f.dataType))
        cols.append(c.alias(f.name))
    return df.select(*cols)


def _seconds_between(start: Column, end: Column) -> Column:
    return ((F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)).cast(T.DoubleType())


def run_lengths(phases_df: DataFrame, min_run_steps: int = 1) -> DataFrame:
    """Run-length encoded phase sequence of every container, in the :data:`~ai4dl.schema.PHASE_SEQUENCES` schema.

    Per container ``(pod_id, service)``, labelled steps (``phase`` not null) are ordered by ``step``; a run id
    is the running sum of "phase differs from the previous labelled step" (``lag`` + cumulative ``sum`` over a
    window), so a null phase never splits a run (see the module notes). Each run gets its first/last ``ts`` and
    ``step``, ``duration_steps`` (labelled steps) and ``duration_seconds`` (``end_ts - start_ts``).

    ``min_run_steps > 1`` smooths the sequence as :func:`smooth_runs` does (short runs absorbed into the previous
    long run, or the next when they lead; then equal neighbours merged and runs renumbered), with window
    functions over each container's *runs*: :func:`smooth_container_runs` is the same in pandas, one container
    at a time, and the reference it is tested against.
    """
    w = Window.partitionBy(*CONTAINER).orderBy("step")
    labelled = phases_df.where(F.col("phase").isNotNull()).select(*CONTAINER, TS, "step", "phase")
    flagged = labelled.withColumn(
        "_new",
        F.when(F.lag("phase").over(w).eqNullSafe(F.col("phase")), F.lit(0)).otherwise(F.lit(1)),
    )
    with_run = flagged.withColumn(
        "run", (F.sum("_new").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)) - 1).cast("int")
    )
    runs = with_run.groupBy(*CONTAINER, "run").agg(
        F.first("phase").alias("phase"),  # constant within a run
        F.min_by(TS, "step").alias("start_ts"),
        F.max_by(TS, "step").alias("end_ts"),
        F.min("step").alias("start_step"),
        F.max("step").alias("end_step"),
        F.count(F.lit(1)).cast("int").alias("duration_steps"),
    )
    if min_run_steps is None or min_run_steps <= 1:
        runs = runs.withColumn("duration_seconds", _seconds_between(F.col("start_ts"), F.col("end_ts")))
        return conform(runs, PHASE_SEQUENCES)
    return conform(_smoothed(runs, int(min_run_steps)), PHASE_SEQUENCES)


def _smoothed(runs: DataFrame, min_len: int) -> DataFrame:
    """:func:`smooth_runs` over every container's runs (the ``runs`` aggregate of :func:`run_lengths`).

    Each run takes the phase of the last long run (``duration_steps >= min_len``) at or before it, or, leading,
    of the first long run after it; with no long run at all, its own. Consecutive runs of one phase are then one
    smoothed run: that is the block :func:`smooth_runs` forms from a long run and the short runs it absorbs,
    merged with its neighbours of the same phase. ``duration_seconds`` is computed as pandas'
    ``Timedelta.total_seconds()`` (whole seconds plus microseconds / 1e6), as the smoothing always reported it.
    """
    by_run = Window.partitionBy(*CONTAINER).orderBy("run")
    long_phase = F.when(F.col("duration_steps") >= min_len, F.col("phase"))
    before = F.last(long_phase, ignorenulls=True).over(by_run.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    after = F.first(long_phase, ignorenulls=True).over(by_run.rowsBetween(Window.currentRow, Window.unboundedFollowing))
    runs = runs.withColumn("_phase", F.coalesce(before, after, F.col("phase")))
    runs = runs.withColumn("_new", F.when(F.lag("_phase").over(by_run) == F.col("_phase"), F.lit(0)).otherwise(F.lit(1)))
    runs = runs.withColumn("_block", F.sum("_new").over(by_run.rowsBetween(Window.unboundedPreceding, Window.currentRow)) - 1)
    blocks = runs.groupBy(*CONTAINER, "_block").agg(
        F.first("_phase").alias("phase"),  # constant within a block
        F.min_by("start_ts", "run").alias("start_ts"),
        F.max_by("end_ts", "run").alias("end_ts"),
        F.min("start_step").alias("start_step"),
        F.max("end_step").alias("end_step"),
        F.sum("duration_steps").alias("duration_steps"),
    )
    micros = F.unix_micros(F.col("end_ts")) - F.unix_micros(F.col("start_ts"))
    fraction = F.pmod(micros, F.lit(1_000_000))
    seconds = (micros - fraction) / F.lit(1_000_000) + fraction.cast("double") / F.lit(1e6)  # exact whole seconds
    return blocks.withColumnRenamed("_block", "run").withColumn("duration_seconds", seconds)


def smooth_container_runs(pdf: pd.DataFrame, min_len: int) -> pd.DataFrame:
    """:func:`smooth_runs` applied to one container's runs (PHASE_SEQUENCES rows), as a pandas frame.

    Positions handed to :func:`smooth_runs` are cumulative labelled-step offsets, so every smoothed run maps back
    to a contiguous block of original runs: its phase from the smoothing, its ``start_*`` from the first run of
    the block, ``end_*`` from the last, ``duration_steps`` summed, ``duration_seconds`` recomputed.
    """
    cols = [f.name for f in PHASE_SEQUENCES.fields]
    if pdf.empty:
        return pdf[cols]
    pdf = pdf.sort_values("run").reset_index(drop=True)
    lengths = pdf["duration_steps"].astype(int).tolist()
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    smoothed = smooth_runs(list(zip(pdf["phase"].astype(int).tolist(), offsets, lengths)), min_len)
    rows = []
    first = 0
    for i, (phase, start, length) in enumerate(smoothed):
        end_off = start + length
        last = first
        while last + 1 < len(offsets) and offsets[last + 1] < end_off:
            last += 1
        a, b = pdf.iloc[first], pdf.iloc[last]
        rows.append(
            {
                POD_ID: a[POD_ID],
                SERVICE: a[SERVICE],
                "run": i,
                "phase": int(phase),
                "start_ts": a["start_ts"],
                "end_ts": b["end_ts"],
                "start_step": int(a["start_step"]),
                "end_step": int(b["end_step"]),
                "duration_steps": int(length),
                "duration_seconds": float((pd.Timestamp(b["end_ts"]) - pd.Timestamp(a["start_ts"])).total_seconds()),
            }
        )
        first = last + 1
    out = pd.DataFrame(rows, columns=cols)
    for c in ("run", "phase", "start_step", "end_step", "duration_steps"):
        out[c] = out[c].astype("int32")
    return out


def transition_counts(sequences_df: DataFrame) -> DataFrame:
    """Phase-to-phase transitions between consecutive runs of each container (:data:`TRANSITIONS` schema).

    ``count`` is the number of times a run of ``src`` is directly followed by a run of ``dst`` (fleet-wide), and
    ``probability = count / sum(count for that src)``, the empirical ``P(next = dst | leaving src)``. Only real
    changes appear (consecutive runs differ by construction); a container's first run has no incoming and its
    last run no outgoing transition, so a phase seen only at the end of lives has no ``src`` row.
    """
    counts = _run_pairs(sequences_df).groupBy("src", "dst").agg(F.count(F.lit(1)).alias("count"))
    counts = counts.withColumn(
        "probability", F.col("count") / F.sum("count").over(Window.partitionBy("src"))
    )
    return conform(counts, TRANSITIONS)


def service_transition_counts(sequences_df: DataFrame) -> DataFrame:
    """:func:`transition_counts` per service: ``service``, ``src``, ``dst``, ``count`` (one row per service and
    transition seen; a job template's own cycle, which the next-phase rule reads beside the fleet's,
    :mod:`ai4dl.policies.nextphase`). Small: services x k x k rows."""
    return _run_pairs(sequences_df).groupBy(SERVICE, "src", "dst").agg(F.count(F.lit(1)).alias("count"))


def _run_pairs(sequences_df: DataFrame) -> DataFrame:
    """``service``, ``src``, ``dst``: each run's phase and the phase of the container's next run."""
    w = Window.partitionBy(*CONTAINER).orderBy("run")
    return sequences_df.select(SERVICE, F.col("phase").alias("src"), F.lead("phase").over(w).alias("dst")).where(
        F.col("dst").isNotNull()
    )


def dwell_stats(sequences_df: DataFrame) -> DataFrame:
    """Per phase: ``runs`` (how many runs of it), ``mean_dwell_steps``, ``mean_dwell_seconds`` (:data:`DWELL`)."""
    agg = sequences_df.groupBy("phase").agg(
        F.count(F.lit(1)).alias("runs"),
        F.avg("duration_steps").alias("mean_dwell_steps"),
        F.avg("duration_seconds").alias("mean_dwell_seconds"),
    )
    return conform(agg, DWELL)


# Paths (input of the prototype tree)


def container_phase_paths(sequences_df: DataFrame) -> DataFrame:
    """Each container's *path*: ``pod_id``, ``service``, ``path`` (array<int> of run phases, ordered by run)."""
    agg = sequences_df.groupBy(*CONTAINER).agg(F.sort_array(F.collect_list(F.struct("run", "phase"))).alias("_runs"))
    return agg.select(*CONTAINER, F.transform("_runs", lambda s: s["phase"]).alias("path"))


def path_counts(sequences_df: DataFrame, max_depth: int | None = None) -> DataFrame:
    """Distinct paths and how many containers follow each: ``path`` array<int>, ``count`` long.

    With ``max_depth`` the paths are cut to their first ``max_depth`` runs before counting. This is the only
    prototype input that goes to the driver: one row per distinct path, never one per container.
    """
    paths = container_phase_paths(sequences_df)
    if max_depth is not None:
        paths = paths.withColumn("path", F.slice("path", 1, int(max_depth)))
    return paths.groupBy("path").count()


def collect_path_counts(sequences_df: DataFrame, max_depth: int | None = None) -> list[tuple[tuple[int, ...], int]]:
    """:func:`path_counts` on the driver as ``[(path_tuple, count), ...]``, input for :func:`prototype_tree`."""
    return [(tuple(int(p) for p in r["path"]), int(r["count"])) for r in path_counts(sequences_df, max_depth).collect()]

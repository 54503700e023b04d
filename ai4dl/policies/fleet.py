"""The policy replay over a fleet in Spark: one :func:`~ai4dl.policies.replay.replay_container` per container in
the executors, fleet totals per (policy, resource), and the per-phase statistics the phase policy allocates from.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from ai4dl.config import POLICIES, PoliciesConfig
from ai4dl.lake.schema import POLICY_FRONTIER, POLICY_REPLAY
from ai4dl.policies.nextphase import normalise_transitions
from ai4dl.policies.forecast import trace_inputs
from ai4dl.policies.replay import INPUT_COLUMNS, REPLAY_COLUMNS, Trace, replay_container, replay_container_grid
from ai4dl.policies.rules import HEADROOM_LEVELS, RESOURCES, finite_value, normalise_stats


def _plain(phase_stats: Mapping | None, transitions: Any) -> tuple[dict, dict]:
    """Phase statistics and transition probabilities as plain picklable dicts, read once on the driver
    (``transitions`` may be the small gold ``phase_transitions`` Spark DataFrame)."""
    stats = {int(k): dict(v) for k, v in normalise_stats(phase_stats).items()}
    flat = {(src, dst): p for src, dsts in normalise_transitions(transitions).items() for dst, p in dsts.items()}
    return stats, flat


def _by_container(phases_df: DataFrame) -> DataFrame:
    """The replay's input spread over at least two tasks per core, by container.

    A replay is seconds of Python per container on a few megabytes of input: left to adaptive execution, the
    shuffle is coalesced by bytes into as few tasks as the input is large (3 on the demo's fleet, one core
    idle for the last third); a partition count given here is kept as given. Rows per container do not change.
    """
    spark = phases_df.sparkSession
    n = replay_tasks(spark.conf.get("spark.sql.shuffle.partitions"), spark.sparkContext.defaultParallelism)
    return phases_df.select(*INPUT_COLUMNS).repartition(n, "pod_id")


def replay_tasks(shuffle_partitions: str, parallelism: int) -> int:
    """The replay's task count: the session's shuffle partitions, at least two per core. Databricks also accepts
    ``auto`` there (its shuffle sized by the runtime), which gives no count: then two per core.

    >>> replay_tasks("8", 2), replay_tasks("8", 16), replay_tasks("auto", 16)
    (8, 32, 32)
    """
    try:
        given = int(shuffle_partitions)
    except (TypeError, ValueError):
        given = 0
    return max(given, 2 * parallelism)


def replay_fleet(
    phases_df: DataFrame, params: PoliciesConfig | None = None, phase_stats: Mapping | None = None, transitions: Any = None,
    forecasters: Mapping | None = None,
) -> DataFrame:
    """:func:`replay_container` over every container of a ``PHASES`` DataFrame, in the executors."""
    params = params or PoliciesConfig()
    stats, flat = _plain(phase_stats, transitions)

    def replay(pdf: pd.DataFrame) -> pd.DataFrame:
        return replay_container(pdf, params, stats, flat, forecasters)

    return _by_container(phases_df).groupBy("pod_id").applyInPandas(replay, POLICY_REPLAY)


def replay_fleet_grid(
    phases_df: DataFrame,
    params: PoliciesConfig | None = None,
    phase_stats: Mapping | None = None,
    transitions: Any = None,
    knobs: Mapping[str, Sequence[float]] | None = None,
    policies: Sequence[str] | None = None,
    forecasters: Mapping | None = None,
) -> DataFrame:
    """:func:`replay_container_grid` over every container (``POLICY_FRONTIER`` rows), in the executors; summed
    per (policy, resource, knob) it is what :func:`~ai4dl.policies.replay.choose_knob` calibrates on."""
    params = params or PoliciesConfig()
    stats, flat = _plain(phase_stats, transitions)
    grid = {p: [float(v) for v in values] for p, values in (knobs or {}).items()}
    chosen = None if policies is None else list(policies)

    def replay(pdf: pd.DataFrame) -> pd.DataFrame:
        return replay_container_grid(pdf, params, stats, flat, grid, chosen, forecasters)

    return _by_container(phases_df).groupBy("pod_id").applyInPandas(replay, POLICY_FRONTIER)


FORECAST_ROWS = "resource string, x array<double>, y double"


def forecast_training_rows(phases_df: DataFrame, params: PoliciesConfig, phase_list: Sequence[int],
                           max_rows: int, seed: int = 0) -> pd.DataFrame:
    """What a forecaster learns from (:mod:`ai4dl.policies.forecast`): every interval of every container with a
    previous interval and a known peak jump, as ``(resource, x, y)`` rows built in the executors by the same
    :func:`~ai4dl.policies.forecast.trace_inputs` the replay decides with (``x`` with the phase inputs of
    ``phase_list``), then a seeded sample of about ``max_rows`` of them per resource brought to the driver."""
    length = int(params.interval_steps)
    phase_list = [int(p) for p in phase_list]

    def rows(pdf: pd.DataFrame) -> pd.DataFrame:
        trace = Trace.of(pdf, params)
        parts = []
        for resource in RESOURCES:
            inputs = trace_inputs(trace.usage[resource], trace.limit[resource], trace.phases, length, phase_list)
            keep = np.isfinite(inputs.target) & np.isfinite(inputs.prev_max)
            parts.append(pd.DataFrame({"resource": resource, "x": list(inputs.x[keep]), "y": inputs.target[keep]}))
        return pd.concat(parts, ignore_index=True)

    intervals = max(1, phases_df.count() // length)  # about this many intervals per resource
    share = min(1.0, float(max_rows) / intervals)
    out = _by_container(phases_df).groupBy("pod_id").applyInPandas(rows, FORECAST_ROWS)
    if share < 1.0:
        out = out.sample(fraction=share, seed=seed)
    return out.toPandas()


def replay_at_knobs(frontier_df: DataFrame, knobs: Mapping[tuple[str, str], float | None]) -> DataFrame:
    """The ``POLICY_REPLAY`` rows of each (policy, resource) at its knob in ``knobs`` (None: a policy without
    one), read from a frontier :func:`replay_fleet_grid` replayed: a frontier row at a knob value is the replay
    at it (the grid changes one knob at a time), so the fleet need not be replayed again."""
    wanted = None
    for (policy, resource), value in knobs.items():
        at = F.col("knob").isNull() if value is None else F.col("knob") == float(value)
        row = (F.col("policy") == policy) & (F.col("resource") == resource) & at
        wanted = row if wanted is None else wanted | row
    if wanted is None:
        return frontier_df.where(F.lit(False)).select(*REPLAY_COLUMNS)
    return frontier_df.where(wanted).select(*REPLAY_COLUMNS)


def frontier_totals(frontier_df: DataFrame) -> pd.DataFrame:
    """``POLICY_FRONTIER`` rows summed per (policy, resource, knob), with the number of containers: the small
    table (policies x knob values x resources) that calibration and the frontier plot read on the driver."""
    sums = ["steps", "hours", "met_steps", "used", "allocated", "static_allocated", "oom_kills", "throttled_steps",
            "throttled_core_seconds", "shortfall_steps"]
    return (
        frontier_df.groupBy("policy", "resource", "knob")
        .agg(F.countDistinct("pod_id").alias("containers"), *[F.sum(c).alias(c) for c in sums])
        .toPandas()
    )


def _ratio(num, den):
    return F.when(den != 0, num / den)


def summarise(replay_df: DataFrame) -> DataFrame:
    """Fleet totals per (policy, resource) of a ``POLICY_REPLAY`` DataFrame.

    ``oom_kills_per_100h`` is per 100 container-hours (memory rows); ``savings_vs_static = 1 - allocated /
    static_allocated``; ``savings_vs_prev_rules = 1 - allocated /
    allocated(prev.step.rules)`` of the same resource; ``fulfilment = met_steps / steps``; ``utilisation =
    used / allocated``. A ratio with a zero denominator is null. Ordered by resource, then :data:`POLICIES`.
    """
    agg = replay_df.groupBy("policy", "resource").agg(
        F.count("pod_id").alias("containers"),  # one replay row per container and (policy, resource)
        F.sum("steps").alias("steps"),
        F.sum("hours").alias("hours"),
        F.sum("used").alias("used"),
        F.sum("allocated").alias("allocated"),
        F.sum("static_allocated").alias("static_allocated"),
        F.sum("met_steps").alias("met_steps"),
        F.sum("shortfall_steps").alias("shortfall_steps"),
        F.sum("shortfall_total").alias("shortfall_total"),
        F.max("shortfall_max").alias("shortfall_max"),
        F.sum("oom_kills").alias("oom_kills"),
        F.sum("throttled_steps").alias("throttled_steps"),
        F.sum("throttled_core_seconds").alias("throttled_core_seconds"),
    )
    by_resource = Window.partitionBy("resource")
    prev_rules = F.max(F.when(F.col("policy") == "prev.step.rules", F.col("allocated"))).over(by_resource)
    order = F.array_position(F.array(*[F.lit(p) for p in POLICIES]), F.col("policy"))
    return (
        agg.withColumn("_prev_rules_allocated", prev_rules)
        .select(
            "policy",
            "resource",
            "containers",
            "steps",
            "hours",
            "used",
            "allocated",
            "static_allocated",
            (F.lit(1.0) - _ratio(F.col("allocated"), F.col("static_allocated"))).alias("savings_vs_static"),
            (F.lit(1.0) - _ratio(F.col("allocated"), F.col("_prev_rules_allocated"))).alias("savings_vs_prev_rules"),
            "met_steps",
            _ratio(F.col("met_steps").cast("double"), F.col("steps")).alias("fulfilment"),
            "shortfall_steps",
            "shortfall_total",
            "shortfall_max",
            "oom_kills",
            (F.lit(100.0) * _ratio(F.col("oom_kills"), F.col("hours"))).alias("oom_kills_per_100h"),
            "throttled_steps",
            "throttled_core_seconds",
            _ratio(F.col("used"), F.col("allocated")).alias("utilisation"),
            order.alias("_order"),
        )
        .orderBy("resource", "_order")
        .drop("_order")
    )


def phase_fraction_stats(phases_df: DataFrame, quantile: float = 0.95, accuracy: int = 10_000) -> dict[int, dict[str, float]]:
    """``{phase: {"cpu_fraction": q, "mem_fraction": q}}``: the phase's ``quantile`` of usage / limit.

    On a fleet of different container sizes an absolute statistic (cores, bytes) of a phase mixes small and
    large containers; as a share of each container's own limit it transfers between them, so ``phase.rule``
    allocates ``share * limit``. One Spark aggregation; only k rows reach the driver.
    """
    rows = (
        phases_df.where(F.col("phase").isNotNull())
        .groupBy("phase")
        .agg(
            F.percentile_approx(F.col("cpu_usage_cores") / F.col("cpu_num_cores"), quantile, accuracy).alias("cpu"),
            F.percentile_approx(F.col("mem_current") / F.col("mem_limit"), quantile, accuracy).alias("mem"),
        )
        .collect()
    )
    return {int(r["phase"]): {"cpu_fraction": finite_value(r["cpu"]), "mem_fraction": finite_value(r["mem"])} for r in rows}


def _known(column: str) -> Any:
    """The column with NaN as null: the replay reads usage and limits with NaN for unknown, which pandas' max and
    fill skip and Spark's treat as a number (the largest)."""
    return F.when(~F.isnan(column), F.col(column))


def phase_jumps(phases_df: DataFrame, interval_steps: int) -> DataFrame:
    """Every container's :func:`~ai4dl.policies.replay.container_jumps` rows (``phase bigint, resource string,
    jump double``), computed by Spark's own aggregations rather than shipping every step to Python: per
    container and interval of steps (aligned at the container's first step, as the replay aligns them) the
    maximum usage, the last labelled phase and the limits at its ends; then, over each container's intervals in
    order, the phase before the interval, the limit at its first step (forward-, then back-filled, as the replay
    fills an unknown limit) and ``(max_i - max_{i-1}) / limit``, the same double operations as
    :func:`~ai4dl.policies.replay.jumps_of`. Steps are unique within a container (the window stage numbers them,
    the stream counts on)."""
    length = int(interval_steps)
    steps = phases_df.select("pod_id", "step", "phase", *[c for r in RESOURCES.values() for c in r])
    firsts = steps.groupBy("pod_id").agg(F.min("step").alias("_first"))  # one row per container
    per_step = steps.join(F.broadcast(firsts), "pod_id").withColumn(
        "_iv", F.floor((F.col("step") - F.col("_first")) / length))
    known_phase_step = F.when(F.col("phase").isNotNull(), F.col("step"))
    aggs = [F.first("_first").alias("_first"), F.max_by("phase", known_phase_step).alias("_last_phase")]
    for r, (usage, limit) in RESOURCES.items():
        lim = _known(limit)
        lim_step = F.when(lim.isNotNull(), F.col("step"))  # the steps whose limit is known
        aggs += [F.max(_known(usage)).alias(f"_{r}_max"), F.min(lim_step).alias(f"_{r}_lim0_step"),
                 F.min_by(lim, lim_step).alias(f"_{r}_lim0"), F.max_by(lim, lim_step).alias(f"_{r}_lim1")]
    intervals = per_step.groupBy("pod_id", "_iv").agg(*aggs)
    in_order = Window.partitionBy("pod_id").orderBy("_iv")
    before = in_order.rowsBetween(Window.unboundedPreceding, -1)
    after = in_order.rowsBetween(Window.currentRow, Window.unboundedFollowing)
    adjacent = F.lag("_iv").over(in_order) == F.col("_iv") - 1
    start = F.col("_first") + F.col("_iv") * length
    cols = [F.last("_last_phase", ignorenulls=True).over(before).alias("phase")]
    for r in RESOURCES:
        limit = F.coalesce(F.when(F.col(f"_{r}_lim0_step") == start, F.col(f"_{r}_lim0")),
                           F.last(f"_{r}_lim1", ignorenulls=True).over(before),
                           F.first(f"_{r}_lim0", ignorenulls=True).over(after))
        rise = F.col(f"_{r}_max") - F.lag(f"_{r}_max").over(in_order)
        cols.append(F.when(adjacent & (limit != 0), rise / limit).alias(r))
    jumps = intervals.select(*cols).where(F.col("phase").isNotNull())
    return (
        jumps.select(F.col("phase").cast("bigint").alias("phase"),
                     F.explode(F.array(*[F.struct(F.lit(r).alias("resource"), F.col(r).alias("jump")) for r in RESOURCES])).alias("_j"))
        .select("phase", "_j.resource", "_j.jump")
        .where(~F.isnan("jump") & (F.abs("jump") != float("inf")))  # null (no jump) drops out here too
    )


def phase_headroom_stats(
    phases_df: DataFrame, params: PoliciesConfig | None = None, accuracy: int = 10_000
) -> dict[int, dict[str, list[float]]]:
    """``{phase: {"cpu_headroom": [...], "mem_headroom": [...]}}``: per phase, the quantiles at
    :data:`~ai4dl.policies.replay.HEADROOM_LEVELS` of the interval-to-interval jumps of usage (as a share of the
    limit) seen after that phase, which ``phase.headroom`` allocates from: the jumps of :func:`phase_jumps`
    reduced per (phase, resource) by one approximate-percentile aggregation; only k x 2 rows reach the driver.
    Give it the training containers only."""
    params = params or PoliciesConfig()
    levels = F.array(*[F.lit(float(q)) for q in HEADROOM_LEVELS])
    rows = (
        phase_jumps(phases_df, int(params.interval_steps))
        .groupBy("phase", "resource")
        .agg(F.percentile_approx("jump", levels, accuracy).alias("quantiles"))
        .collect()
    )
    out: dict[int, dict[str, list[float]]] = {}
    for r in rows:
        out.setdefault(int(r["phase"]), {})[f"{r['resource']}_headroom"] = [float(v) for v in r["quantiles"]]
    return out

"""Every table's columns, declared once.

The names themselves live in :mod:`ai4dl.lake.columns` (no Spark needed); the Spark schemas built from them here.
"""

from __future__ import annotations

from pyspark.sql import types as T

from ai4dl.lake.columns import (  # noqa: F401  (re-exported: one import for names and schemas)
    BEHAVIOUR, DEFAULT_FEATURES, EVENT_DATE, METRICS, POD_ID, POLICY_CALIBRATION_FIELDS, POLICY_FRONTIER_FIELDS, POLICY_LADDER_FIELDS, POLICY_REPLAY_FIELDS, RECOMMENDATION_FIELDS, SERVICE, SOURCE_COLUMNS, STREAM_STATE_FIELDS, TS, lake_name,
    source_name,
)

_metric_fields = [T.StructField(m, T.DoubleType(), True) for m in METRICS]

BRONZE = T.StructType(
    [
        T.StructField(POD_ID, T.StringType(), False),
        T.StructField(SERVICE, T.StringType(), False),
        T.StructField(TS, T.TimestampType(), False),
        *_metric_fields,
        T.StructField(BEHAVIOUR, T.StringType(), True),
        T.StructField("source_file", T.StringType(), True),
        T.StructField("ingested_at", T.TimestampType(), False),
        T.StructField(EVENT_DATE, T.DateType(), False),
    ]
)
BRONZE_PARTITIONS = (SERVICE, EVENT_DATE)

QUARANTINE = T.StructType(
    [
        T.StructField("source_file", T.StringType(), True),
        T.StructField("raw", T.StringType(), False),  # the row as read, JSON
        T.StructField("reason", T.StringType(), False),
        T.StructField("raw_hash", T.StringType(), False),  # sha256 of raw: with source_file and reason, the key
        T.StructField("occurrences", T.LongType(), False),  # identical bad rows in one file are stored once, counted
        T.StructField("quarantined_at", T.TimestampType(), False),
    ]
)

# The generator's output: the export's own (dotted) column names, so it is ingested like a real export.
GENERATED_SOURCE = T.StructType(
    [
        T.StructField("timestamp", T.LongType(), False),
        T.StructField("service", T.StringType(), False),
        T.StructField("pod.id", T.StringType(), False),
        T.StructField("cpu.num.cores", T.DoubleType(), False),
        T.StructField("cpu.usage", T.DoubleType(), False),
        T.StructField("cpu.usage.cores", T.DoubleType(), False),
        T.StructField("cpu.usage.pct", T.DoubleType(), False),
        T.StructField("cpu.usage.pct.container.requested", T.DoubleType(), False),
        T.StructField("mem.current", T.DoubleType(), False),
        T.StructField("mem.limit", T.DoubleType(), False),
        T.StructField("mem.usage.pct", T.DoubleType(), False),
        T.StructField("mem.working.set", T.DoubleType(), False),
        T.StructField("behaviour", T.StringType(), False),
    ]
)

# Silver: one row per container step, scaled features of the step and its flattened history.
# ``history`` is time-major, oldest first: [x(t-n) features..., x(t-n+1) features..., ..., x(t-1) features...].
SILVER = T.StructType(
    [
        T.StructField(POD_ID, T.StringType(), False),
        T.StructField(SERVICE, T.StringType(), False),
        T.StructField(TS, T.TimestampType(), False),
        T.StructField("step", T.IntegerType(), False),  # 0-based position in the container's ordered trace
        T.StructField("segment", T.IntegerType(), False),  # increments after a gap longer than max_gap_seconds
        T.StructField("features", T.ArrayType(T.DoubleType(), True), False),
        T.StructField("history", T.ArrayType(T.DoubleType(), True), True),  # null without full history
        T.StructField("has_full_history", T.BooleanType(), False),
        T.StructField("cpu_usage_cores", T.DoubleType(), True),  # raw demand, kept for statistics and policies
        T.StructField("cpu_num_cores", T.DoubleType(), True),
        T.StructField("mem_current", T.DoubleType(), True),
        T.StructField("mem_limit", T.DoubleType(), True),
        T.StructField(BEHAVIOUR, T.StringType(), True),
    ]
)
SILVER_PARTITIONS = (SERVICE,)

# Phases: the silver row's key and raw demand, its phase, the distance to that phase's centre, hidden activations.
PHASES = T.StructType(
    [
        T.StructField(POD_ID, T.StringType(), False),
        T.StructField(SERVICE, T.StringType(), False),
        T.StructField(TS, T.TimestampType(), False),
        T.StructField("step", T.IntegerType(), False),
        T.StructField("phase", T.IntegerType(), True),  # null without full history
        T.StructField("distance", T.DoubleType(), True),
        T.StructField("activations", T.ArrayType(T.DoubleType(), True), True),
        T.StructField("cpu_usage_cores", T.DoubleType(), True),
        T.StructField("cpu_num_cores", T.DoubleType(), True),
        T.StructField("mem_current", T.DoubleType(), True),
        T.StructField("mem_limit", T.DoubleType(), True),
        T.StructField(BEHAVIOUR, T.StringType(), True),
        T.StructField("model_id", T.StringType(), False),
    ]
)
PHASES_PARTITIONS = (SERVICE,)

# Gold: run-length encoded phase sequence per container.
PHASE_SEQUENCES = T.StructType(
    [
        T.StructField(POD_ID, T.StringType(), False),
        T.StructField(SERVICE, T.StringType(), False),
        T.StructField("run", T.IntegerType(), False),  # 0-based index of the run in the container's life
        T.StructField("phase", T.IntegerType(), False),
        T.StructField("start_ts", T.TimestampType(), False),
        T.StructField("end_ts", T.TimestampType(), False),
        T.StructField("start_step", T.IntegerType(), False),
        T.StructField("end_step", T.IntegerType(), False),
        T.StructField("duration_steps", T.IntegerType(), False),
        T.StructField("duration_seconds", T.DoubleType(), False),
    ]
)

# Gold: demand statistics per service and phase (+ fleet-wide rows with service = "__all__").
# cpu_* are on cpu_usage_cores (cores), mem_* on mem_current (bytes); *_std are stddev_samp (null for one sample);
# percentiles are percentile_approx at DEFAULT_ACCURACY; samples counts labelled steps (phase not null), the
# cpu/mem aggregates ignore null metric values; mean_dwell_* come from the phase sequences (null when the
# phase has no run there, e.g. all its runs were smoothed away).
PHASE_STATS = T.StructType(
    [
        T.StructField(SERVICE, T.StringType(), False),
        T.StructField("phase", T.IntegerType(), False),
        T.StructField("phase_name", T.StringType(), True),  # the labelling model's words (ai4dl.behaviour.naming)
        T.StructField("samples", T.LongType(), False),
        T.StructField("cpu_mean", T.DoubleType(), True),
        T.StructField("cpu_std", T.DoubleType(), True),
        T.StructField("cpu_p50", T.DoubleType(), True),
        T.StructField("cpu_p95", T.DoubleType(), True),
        T.StructField("cpu_p99", T.DoubleType(), True),
        T.StructField("cpu_max", T.DoubleType(), True),
        T.StructField("mem_mean", T.DoubleType(), True),
        T.StructField("mem_std", T.DoubleType(), True),
        T.StructField("mem_p50", T.DoubleType(), True),
        T.StructField("mem_p95", T.DoubleType(), True),
        T.StructField("mem_p99", T.DoubleType(), True),
        T.StructField("mem_max", T.DoubleType(), True),
        T.StructField("mean_dwell_steps", T.DoubleType(), True),
        T.StructField("mean_dwell_seconds", T.DoubleType(), True),
    ]
)

# Gold: fleet-wide transitions between consecutive runs; probability = count / all transitions out of src.
TRANSITIONS = T.StructType(
    [
        T.StructField("src", T.IntegerType(), False),
        T.StructField("dst", T.IntegerType(), False),
        T.StructField("count", T.LongType(), False),
        T.StructField("probability", T.DoubleType(), False),
    ]
)

# Per phase: how many runs and how long they last (from the sequences).
DWELL = T.StructType(
    [
        T.StructField("phase", T.IntegerType(), False),
        T.StructField("runs", T.LongType(), False),
        T.StructField("mean_dwell_steps", T.DoubleType(), False),
        T.StructField("mean_dwell_seconds", T.DoubleType(), False),
    ]
)

_SQL_TYPES = {
    "string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType(), "double": T.DoubleType(),
    "boolean": T.BooleanType(), "timestamp": T.TimestampType(), "array<double>": T.ArrayType(T.DoubleType(), True),
}


def _struct(declared: tuple[tuple[str, str, bool], ...]) -> T.StructType:
    """The Spark schema of fields declared without Spark as (name, SQL type, nullable)."""
    return T.StructType([T.StructField(n, _SQL_TYPES[t], nullable) for n, t, nullable in declared])


# Gold: one row per replayed container, policy and resource (cpu in cores, mem in bytes).
POLICY_REPLAY = _struct(POLICY_REPLAY_FIELDS)
# Calibration: the replay of every (policy, knob value, resource), see ai4dl.policies.replay.replay_container_grid.
POLICY_FRONTIER = _struct(POLICY_FRONTIER_FIELDS)
# Gold: each policy at the matched service level (knob chosen on training containers, scored held out).
POLICY_CALIBRATION = _struct(POLICY_CALIBRATION_FIELDS)
# Gold: what knowing the phase is worth, per resource, service level and rung (ai4dl.policies.ladder).
POLICY_LADDER = _struct(POLICY_LADDER_FIELDS)

# Gold: the live recommendation per container (ai4dl stream); see ai4dl.lake.columns.RECOMMENDATION_FIELDS.
RECOMMENDATIONS = _struct(RECOMMENDATION_FIELDS)
# The stream's per-container state in Spark's state store (see ai4dl.stream.online).
STREAM_STATE = _struct(STREAM_STATE_FIELDS)


def _stream_output() -> T.StructType:
    """What the stream's stateful step emits, one schema for three kinds of rows (``kind``): ``phase`` rows
    (the PHASES columns), one ``rec`` row per container and batch (the RECOMMENDATIONS columns) and ``late``
    rows (a sample older than the container's last labelled step: ``raw`` JSON, ``reason``). A column a kind
    does not use is null; ``ingested_at`` (when the sample landed in bronze) measures the delay."""
    seen: dict[str, T.DataType] = {"kind": T.StringType()}
    for f in [*PHASES.fields, *RECOMMENDATIONS.fields]:
        seen.setdefault(f.name, f.dataType)
    seen.update({"source_file": T.StringType(), "raw": T.StringType(), "reason": T.StringType(),
                 "ingested_at": T.TimestampType()})
    return T.StructType([T.StructField(n, t, True) for n, t in seen.items()])


STREAM_OUTPUT = _stream_output()

# One row when a run starts (status "started", table "-"), then one per table or model it wrote (status
# "finished") or one "failed" row with the error: a run with no row after "started" died (killed, lost node).
RUN_LOG = T.StructType(
    [
        T.StructField("run_id", T.StringType(), False),
        T.StructField("job", T.StringType(), False),
        T.StructField("table", T.StringType(), False),
        T.StructField("delta_version", T.LongType(), True),
        T.StructField("rows", T.LongType(), True),
        T.StructField("config_hash", T.StringType(), False),
        T.StructField("finished_at", T.TimestampType(), True),  # null on the "started" row
        # started | finished | failed (null: rows of ai4dl <= 0.1) | model (the stream switched model: message)
        T.StructField("status", T.StringType(), True),
        T.StructField("started_at", T.TimestampType(), True),
        T.StructField("message", T.StringType(), True),  # the error of a failed run
    ]
)

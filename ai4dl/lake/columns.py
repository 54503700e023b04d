"""Column names of the lake and of the source exports: plain strings, importable without Spark.

Column names inside the lake are snake_case: the dotted names of the DLaaS export (``pod.id``, ``cpu.usage``)
need back-quoting in every SQL expression and confuse BI tools, so ingest renames them once, through
:data:`SOURCE_COLUMNS`, and every later stage speaks only the names below.
"""

from __future__ import annotations

# Natural key of a sample: one row per container per timestamp.
POD_ID = "pod_id"
SERVICE = "service"
TS = "ts"
EVENT_DATE = "event_date"
BEHAVIOUR = "behaviour"  # ground truth, only in generated traces

# Metric columns, in the order of the reference export.
METRICS: tuple[str, ...] = (
    "cpu_num_cores",
    "cpu_usage",
    "cpu_usage_cores",
    "cpu_usage_pct",
    "cpu_usage_pct_container_requested",
    "mem_current",
    "mem_limit",
    "mem_usage_pct",
    "mem_working_set",
)

# Default CRBM features: the eight the original AI4DL DLaaS model was trained on (all metrics but the core count).
DEFAULT_FEATURES: tuple[str, ...] = (
    "cpu_usage",
    "cpu_usage_cores",
    "cpu_usage_pct",
    "cpu_usage_pct_container_requested",
    "mem_current",
    "mem_limit",
    "mem_usage_pct",
    "mem_working_set",
)

# Features derived from the metrics (computed by :mod:`ai4dl.method.features`, which defines each one): usage as a
# share of the limits and short rolling summaries of it. Named here so the configuration checks them without
# importing the method.
DERIVED_FEATURES: tuple[str, ...] = (
    "cpu_frac", "mem_frac", "cpu_frac_min10", "ln_cpu_frac_std20", "ln_absd_mem_frac_mean10", "ln_absd_cpu_frac_mean10",
    "cpu_frac_median10", "cpu_frac_max10", "mem_frac_slope10", "mem_frac_range20", "ln_absd_mem_frac_mean5",
    "ln_cpu_frac_std10", "ln_medd_mem_frac10", "cpu_frac_min5", "cpu_frac_min3", "ln_cpu_frac_std5",
    "ln_medd_mem_frac5", "ln_absd_cpu_frac_mean5",
)
# The behaviour features (the default): chosen on the training containers of a generated fleet of one seed and
# confirmed on another's (bench/feature_ablation.py; bench/README.md has the ablation): the memory level, the
# CPU floor and spread, how much memory moves from step to step (the median change, which one level shift at
# a phase change does not move) and the mean CPU change; then the CPU floor and memory's median change once
# more over the last 3 and 5 steps, beside their 10-step forms (forward ARI 0.861 -> 0.907 and 0.871 -> 0.895
# on the two development fleets' training containers).
BEHAVIOUR_FEATURES: tuple[str, ...] = (
    "cpu_frac_min10", "mem_frac", "ln_cpu_frac_std20", "ln_medd_mem_frac10", "ln_absd_cpu_frac_mean10",
    "cpu_frac_min3", "ln_medd_mem_frac5",
)

# Source (export) name -> lake name. Overridable per job through the ``ingest.columns`` config key.
SOURCE_COLUMNS: dict[str, str] = {
    "timestamp": TS,
    "service": SERVICE,
    "pod.id": POD_ID,
    **{m.replace("_", "."): m for m in METRICS},
    "behaviour": BEHAVIOUR,
}


def lake_name(source_name: str) -> str:
    """Lake column of a source column name (``cpu.usage.pct`` -> ``cpu_usage_pct``)."""
    return SOURCE_COLUMNS.get(source_name, source_name.replace(".", "_"))


def source_name(lake: str) -> str:
    """Source (export) column name of a lake column."""
    for src, dst in SOURCE_COLUMNS.items():
        if dst == lake:
            return src
    return lake


# The policy replay's rows, one per (container, policy, resource): (name, Spark SQL type, nullable). Declared
# here, without Spark, because the pure replay (:mod:`ai4dl.policies.replay`) builds these frames itself;
# :data:`ai4dl.lake.schema.POLICY_REPLAY` is the Spark schema built from it.
POLICY_REPLAY_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("pod_id", "string", False),
    ("service", "string", True),
    ("policy", "string", False),
    ("resource", "string", False),  # cpu | mem
    ("steps", "bigint", False),  # steps with known usage and limit
    ("hours", "double", False),  # container-hours of those steps (each lasts until the next timestamp)
    ("used", "double", False),  # sum of usage over those steps
    ("allocated", "double", False),  # sum of the policy's allocation
    ("static_allocated", "double", False),  # sum of the limit
    ("met_steps", "bigint", False),  # allocation >= usage
    ("shortfall_steps", "bigint", False),
    ("shortfall_total", "double", False),  # sum of max(usage - allocation, 0)
    ("shortfall_max", "double", False),  # 0 without steps
    # Shortfalls as the container feels them: memory above its allocation is an OOM kill, CPU above it is
    # throttling. Each is 0 on the other resource's rows.
    ("oom_kills", "bigint", False),  # mem: OOM-kill events (the policy reacts to each; ai4dl.policies.rules)
    ("throttled_steps", "bigint", False),  # cpu: steps with usage > allocation
    ("throttled_core_seconds", "double", False),  # cpu: sum of max(usage - allocation, 0) x step duration (s)
)

# The calibration frontier: the replay rows of every (policy, knob value, resource). ``knob`` is the value of the
# policy's one knob (:data:`ai4dl.policies.replay.KNOBS`), null for the policies without one. The replay's
# columns come first, so dropping ``knob`` gives a ``POLICY_REPLAY`` frame.
POLICY_FRONTIER_FIELDS: tuple[tuple[str, str, bool], ...] = (*POLICY_REPLAY_FIELDS, ("knob", "double", True))

# The calibrated comparison, one row per (policy, resource): the knob chosen on training containers for the
# target fulfilment, and what it gives on the held-out ones (see ai4dl.policies.calibration).
POLICY_CALIBRATION_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("policy", "string", False),
    ("resource", "string", False),  # cpu | mem
    ("knob_name", "string", True),  # the policies config key tuned (null: a policy without a knob)
    ("knob", "double", True),
    ("target_fulfilment", "double", True),  # the share of steps to meet (null: memory held to an OOM budget)
    ("oom_budget_per_100h", "double", True),  # memory's OOM budget, kills per 100 container-hours
    ("train_fulfilment", "double", True),  # on the training containers, where the knob was chosen
    ("train_oom_kills_per_100h", "double", True),  # memory rows: the same, for the OOM budget
    ("reached", "boolean", False),  # the service level was reached on the training containers
    ("deployed", "boolean", False),  # the policy the stream deploys for this resource (the model's best)
    ("containers", "bigint", False),  # held-out containers scored
    ("hours", "double", False),  # their container-hours
    ("steps", "bigint", False),
    ("allocated", "double", False),  # sum over steps: core-steps (cpu) or byte-steps (mem)
    ("static_allocated", "double", False),
    ("fulfilment", "double", True),  # held-out met_steps / steps
    ("savings_vs_static", "double", True),
    ("savings_vs_prev_rules", "double", True),
    ("savings_vs_vpa", "double", True),
    ("oom_kills", "bigint", False),
    ("oom_kills_per_100h", "double", True),  # held-out OOM kills per 100 container-hours
    ("throttled_steps", "bigint", False),
    ("throttled_core_seconds", "double", False),
)

# The value-of-information ladder (ai4dl.policies.ladder), one row per (resource, service level, rung): savings
# against static on the held-out containers and the share of the gap closed between the best baseline and the
# clairvoyant. ``ai4dl policies`` writes the rungs it can (clairvoyant, baseline, best, a, b); bench/ adds c, d.
POLICY_LADDER_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("resource", "string", False),
    ("level", "string", False),  # the service level, in words ("95% of steps met", "<= 10 OOM kills per ...")
    ("rung", "string", False),  # clairvoyant | baseline | best | a | b | c | d | d'
    ("policy", "string", False),
    ("knows", "string", False),  # what the rung's policy is given
    ("savings", "double", True),  # vs static, held out
    ("reached", "boolean", False),  # the level was reached on the training containers
    ("fulfilment", "double", True),  # held-out share of steps met
    ("oom_kills_per_100h", "double", True),  # memory rows
    ("gap_closed", "double", True),  # (savings - baseline) / (clairvoyant - baseline)
)

# Gold: the live recommendation of each container (ai4dl stream), one row per container, replaced when a newer
# step is labelled. ``cpu_cores`` / ``mem_bytes`` are what ``cpu_policy`` / ``mem_policy`` (with the policy model's
# calibrated knobs) allocate for step ``for_step`` (the step after ``step``), the allocation the policy replay
# holds there; ``cpu_num_cores`` / ``mem_limit`` the limit.
RECOMMENDATION_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("pod_id", "string", False),
    ("service", "string", True),
    ("ts", "timestamp", False),  # the newest labelled step
    ("step", "int", False),
    ("phase", "int", True),  # the current phase: the last non-null phase (null: no full window yet)
    ("phase_name", "string", True),
    ("phase_since_ts", "timestamp", True),  # first step of the current run of that phase
    ("phase_since_step", "int", True),
    ("next_phase", "int", True),  # the most likely next phase (null: no known successor)
    ("next_phase_probability", "double", True),
    ("cpu_policy", "string", False),
    ("mem_policy", "string", False),
    ("for_step", "int", False),
    ("interval", "int", False),  # the allocation interval of for_step (policies.interval_steps long)
    ("cpu_cores", "double", True),
    ("mem_bytes", "double", True),
    ("cpu_num_cores", "double", True),
    ("mem_limit", "double", True),
    ("model_id", "string", False),
    ("policy_model_id", "string", False),  # the policy model whose knobs and statistics allocated
    ("late_samples", "bigint", False),  # samples of this container quarantined as late so far
    ("updated_at", "timestamp", False),
)

# The live stream's per-container state (Spark's state store, not a table), O(1) in the container's age: the
# raw metrics of the last n_history + LOOKBACK (ai4dl.method.features) samples of the current segment (all
# METRICS, oldest first, flattened), the current phase run, and the deployed policies' running summaries
# (ai4dl.policies.live: the interval being filled, the last interval's statistics, VPA's decaying histograms) as
# JSON, and the causal decoder's accumulated costs (ai4dl.method.labelling.forward_decode; its current phase is
# run_phase) with the model they belong to; never the trace.
STREAM_STATE_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("service", "string", True),
    ("last_step", "int", False),
    ("last_ts", "double", False),
    ("segment", "int", False),
    ("history", "array<double>", False),
    ("history_len", "int", False),
    ("run_phase", "int", True),
    ("run_since_step", "int", True),
    ("run_since_ts", "double", True),
    ("late_samples", "bigint", False),
    ("policy_state", "string", True),
    ("decode_costs", "array<double>", True),
    ("decode_model", "string", True),
)

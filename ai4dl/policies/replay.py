"""Allocation policies replayed over labelled container traces (the AI4DL evaluation).

Every container is replayed step by step. Time is cut into allocation intervals of ``interval_steps`` steps:
interval ``i`` covers the container's steps ``[s0 + i*L, s0 + (i+1)*L)`` where ``s0`` is the container's first
step (0 for a whole trace, so interval ``i`` is ``[i*L, (i+1)*L)``). At the start of each interval a policy
chooses one allocation per resource (``cpu`` in cores, ``mem`` in bytes) and holds it for the whole interval:

``static``
    the container's limit (``cpu_num_cores`` / ``mem_limit``): the baseline every saving is measured against.
``current.step.max`` (oracle)
    the max of the coming interval's usage.
``current.step.rules`` (oracle)
    ``mean + k_std * std`` (population std) of the coming interval's usage; no margin.
``prev.step.max`` (reactive)
    the max of the previous interval's usage times ``1 + prev_max_margin`` (0 by default: the plain max); the
    first interval gets the limit.
``prev.step.rules`` (reactive)
    ``mean + k_std * std`` of the previous interval; the first interval gets the limit.
``phase.rule``
    the phase of the container is the last non-null phase of a step *before* the interval starts (normally the
    last step of the previous interval); the allocation is that phase's statistic from ``phase_stats`` times
    ``1 + margin``. A statistic is either absolute (``{"cpu": cores, "mem": bytes}``, e.g. the phase's p95 over
    training containers) or a share of the limit (``{"cpu_fraction": f, "mem_fraction": f}``), which is
    multiplied by this container's limit at the interval start, so one fleet statistic fits containers of every
    size. No phase seen yet, or a phase without a (finite) statistic: the limit.
``phase.proactive``
    ``phase.rule`` that also provisions for where the container is likely to go next: with ``p`` the current
    phase (as above) and ``transitions`` the fleet's probabilities ``P(p -> q)`` that the run after a run of
    ``p`` is in phase ``q`` (the gold ``phase_transitions`` table), the allocation is the max of the
    statistics of ``p`` and of every ``q`` with ``P(p -> q) >= proactive_threshold``, times ``1 + margin``, at the
    container's scale as in ``phase.rule``. A reactive policy is short for a whole interval each time a phase
    change lands at an interval boundary; this one is not, as long as the change is a likely one. The
    probabilities say which phase comes next, not when: the likely successors are provisioned for at every
    interval of a run, not only near its end. No phase seen yet, or a phase to provision for without a (finite)
    statistic: the limit. Without ``transitions`` it equals ``phase.rule``.
``phase.headroom``
    a reactive rule whose headroom is learned per phase: the max of the previous interval's usage plus
    ``h(p) * limit``, where ``p`` is the current phase (as in ``phase.rule``) and ``h(p)`` the
    ``headroom_quantile`` (the knob) of the *jumps* seen after phase ``p`` on the training containers: for
    every interval ``i >= 1`` of a training container whose phase before it was ``p``, ``(max of interval i -
    max of interval i-1) / limit`` (:func:`jumps_of`). A steady phase learns a headroom near zero, a
    phase that ramps up learns a large one, a phase that unloads a negative one; each container keeps its own
    level (its last max) and scale (its limit). The jumps are kept per phase as a quantile table
    (``{"cpu_headroom": [...], "mem_headroom": [...]}`` beside the phase's other statistics, the quantiles at
    :data:`HEADROOM_LEVELS`, read by linear interpolation). No phase, no previous usage, or a phase without
    a table: the limit.
``vpa`` (the Kubernetes VPA recommender, v1.8.1)
    the target of the real VPA recommender (:class:`ai4dl.policies.vpa.VpaRecommender`, equal to the Go code
    decision by decision): CPU target for ``cpu``, memory target for ``mem``. Before each interval the
    recommender has been fed, in step order, every known sample of the container before the interval (one
    recommender per container and resource, fed once: O(n)). Its parameters: ``vpa_percentile`` (target
    percentile of both resources, the policy's knob), ``vpa_margin`` (VPA's safety margin; the generic
    ``margin`` is not applied), ``vpa_cpu_half_life_s`` / ``vpa_mem_half_life_s`` (histogram decay) and
    ``vpa_mem_interval_s`` (one memory peak per window), VPA's defaults otherwise (25 millicores / 250 MiB
    minimum). Its clock is the trace's timestamps in seconds (``ts_seconds``, the ``ts`` column in
    :func:`replay_container`), or step index x ``vpa_step_seconds`` without them. Memory is a closed loop as in
    the conformance harness's ``-oom-on-shortfall``: the first step of an interval whose memory usage exceeds
    the memory allocation in force is reported to the recommender as an OOM kill (``RecordOOM`` with that
    allocation as the request, before the step's sample), which bumps its memory histogram; that includes usage
    above the limit before the first recommendation (a container OOM-killed at its limit is seen by VPA too,
    while the harness, which knows no limit, reports nothing then). The first interval, or any interval before
    the resource's first sample, gets the limit. Only a memory target may differ from the harness's: the
    harness waits for a first *CPU* sample, a memory-only replay for a first memory sample.

Conventions, shared by all policies:

* Every allocation is capped at the container's limit (a recommender never allocates above the static request,
  which is what the container was admitted with) and is ``>= 0``.
* Steps with null usage are skipped by the statistics (nan-aware mean/std/max/quantile) and by the metrics. An
  interval whose relevant usage is entirely null gets the limit (nothing to base a decision on).
* Null limits are filled forward then backward within the container (the limit is a per-container constant in
  practice); a step whose limit is still unknown is skipped by the metrics like a null-usage step.
* Rows with a null phase are replayed like any other (their usage is known); only the phase policies' phase
  detection skips them.
* Usage above the limit cannot be met by any policy (allocations are capped), so it counts as shortfall even
  for ``static`` and the oracles.
* Shortfalls are what the container feels: a memory step with usage above the allocation is an OOM kill
  (``oom_kills``), a CPU step above it is throttled (``throttled_steps``, and ``throttled_core_seconds``: the
  missing cores times the step's duration, from consecutive timestamps, see :func:`step_durations`).

Calibration: each policy family has one knob (:data:`KNOBS`) trading allocation for service level.
:func:`replay_container_grid` replays every knob value of a grid and :func:`choose_knob` picks, per policy and
resource, the cheapest value that reaches a target fulfilment, so policies are compared at a matched service
level rather than each at an arbitrary default. :func:`next_phase_f1` scores the transition probabilities
``phase.proactive`` relies on.

This module is numpy/pandas only (importable without Spark); :mod:`ai4dl.policies.fleet` runs
:func:`replay_container` over a Spark DataFrame of the ``PHASES`` schema without collecting the fleet.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ai4dl.errors import ConfigError, InputError
from ai4dl.lake.columns import POLICY_FRONTIER_FIELDS, POLICY_REPLAY_FIELDS
from ai4dl.policies.vpa import VpaParams, VpaRecommender, cpu_targets

POLICIES: tuple[str, ...] = (
    "static",
    "current.step.max",
    "current.step.rules",
    "prev.step.max",
    "prev.step.rules",
    "phase.rule",
    "phase.proactive",
    "phase.headroom",
    "vpa",
)

_MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
# policy -> (the PolicyParams field that is its one knob, the default calibration grid, cheapest first). The
# oracles and static have no knob: they are the bounds a calibrated policy is compared with.
KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    "prev.step.max": ("prev_max_margin", _MARGINS),
    "prev.step.rules": ("k_std", (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0)),
    "phase.rule": ("margin", _MARGINS),
    "phase.proactive": ("margin", _MARGINS),
    "phase.headroom": ("headroom_quantile", (0.5, 0.6, 0.7, 0.8, 0.825, 0.85, 0.875, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0)),
    "vpa": ("vpa_percentile", (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99)),
}

# The quantile levels at which a phase's jumps are kept (phase.headroom): 0, 0.5 %, ..., 100 %.
HEADROOM_LEVELS: tuple[float, ...] = tuple(i / 200 for i in range(201))

# resource -> (usage column, limit column) of the PHASES schema.
RESOURCES: dict[str, tuple[str, str]] = {
    "cpu": ("cpu_usage_cores", "cpu_num_cores"),
    "mem": ("mem_current", "mem_limit"),
}

# One row per (container, policy, resource): the columns of ai4dl.lake.schema.POLICY_REPLAY; with the knob
# value, one row per (container, policy, knob, resource): ai4dl.lake.schema.POLICY_FRONTIER.
REPLAY_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_REPLAY_FIELDS)
FRONTIER_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_FRONTIER_FIELDS)
_PANDAS_DTYPES = {"bigint": "int64", "double": "float64"}

# PHASES columns a replay needs (activations and the rest are not shipped to the Python workers).
INPUT_COLUMNS = ("pod_id", "service", "ts", "step", "phase", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit")


@dataclass(frozen=True)
class PolicyParams:
    """The replay's parameters (the ``policies`` config section without the phase-statistic choice)."""

    interval_steps: int = 10
    k_std: float = 2.0
    margin: float = 0.15
    prev_max_margin: float = 0.0
    proactive_threshold: float = 0.2
    headroom_quantile: float = 0.9
    vpa_percentile: float = 0.9
    vpa_margin: float = 0.15
    vpa_cpu_half_life_s: float = 1200.0
    vpa_mem_half_life_s: float = 1200.0
    vpa_mem_interval_s: float = 1200.0
    vpa_step_seconds: float = 10.0

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ConfigError:
            return ConfigError(f"PolicyParams.{name}={getattr(self, name)!r} is invalid: {allowed}")

        if int(self.interval_steps) < 1:
            raise bad("interval_steps", "must be >= 1")
        for name in ("vpa_percentile", "proactive_threshold", "headroom_quantile"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        for name in ("k_std", "margin", "prev_max_margin", "vpa_margin"):
            if not float(getattr(self, name)) >= 0.0:
                raise bad(name, "must be >= 0")
        for name in ("vpa_cpu_half_life_s", "vpa_mem_half_life_s", "vpa_mem_interval_s", "vpa_step_seconds"):
            if not float(getattr(self, name)) > 0.0:
                raise bad(name, "must be > 0 seconds")

    @classmethod
    def from_config(cls, section: Any) -> "PolicyParams":
        """From the ``policies`` config section (:class:`ai4dl.config.PoliciesConfig` or a mapping of it);
        the section's keys that are not replay parameters (the phase statistic) are ignored."""
        values = section if isinstance(section, Mapping) else {f.name: getattr(section, f.name) for f in fields(section)}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def vpa(self, timed: bool) -> VpaParams:
        """The VPA recommender's parameters; ``timed``: the samples carry timestamps (else step-indexed time)."""
        return VpaParams(
            target_cpu_percentile=float(self.vpa_percentile),
            target_memory_percentile=float(self.vpa_percentile),
            safety_margin_fraction=float(self.vpa_margin),
            cpu_half_life_s=float(self.vpa_cpu_half_life_s),
            memory_half_life_s=float(self.vpa_mem_half_life_s),
            memory_aggregation_interval_s=float(self.vpa_mem_interval_s),
            step_seconds=0.0 if timed else float(self.vpa_step_seconds),
        )


# --------------------------------------------------------------------------------------------------- core


def _as_limit(limit: np.ndarray | float, n: int) -> np.ndarray:
    arr = np.asarray(limit, dtype=float)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if arr.shape != (n,):
        raise InputError(f"limit must be a scalar or have the usage's length {n}, got shape {arr.shape}")
    return arr


def _per_step(name: str, values: Any, n: int, dtype: Any = float) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype).ravel()
    if len(arr) != n:
        raise InputError(f"{name} must have the usage's length {n}, got {len(arr)}")
    return arr


def _blocks(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` padded with NaN to whole intervals, shape (intervals, length)."""
    n_int = -(-len(x) // length)
    padded = np.full(n_int * length, np.nan)
    padded[: len(x)] = x
    return padded.reshape(n_int, length)


def _cap(decision: np.ndarray, lim: np.ndarray) -> np.ndarray:
    """Per-step allocations: the decision capped at the limit, the limit where there is no decision, >= 0."""
    alloc = np.where(np.isnan(decision), lim, np.fmin(decision, lim))  # fmin: a NaN limit does not cap
    return np.maximum(alloc, 0.0)


def _interval_stat(usage: np.ndarray, length: int, stat: str, k: float) -> np.ndarray:
    """Per-interval max or mean + k*std (population), NaN for an interval without usage."""
    b = _blocks(usage, length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN intervals
        if stat == "max":
            return np.nanmax(b, axis=1)
        return np.nanmean(b, axis=1) + k * np.nanstd(b, axis=1)


def _phase_codes(phases: Any) -> np.ndarray:
    """Phases as floats (NaN = unlabelled), whatever they came as (ints, floats, None, strings of ints)."""
    arr = np.asarray(phases)
    if arr.dtype.kind == "f":  # already codes (a replay's trace converts once for all its policies and knobs)
        return arr.astype("float64", copy=False).ravel()
    as_objects = pd.Series(np.asarray(phases, dtype=object).ravel(), dtype="object")
    return pd.to_numeric(as_objects, errors="coerce").astype("float64").to_numpy()


def _phase_before(phases: np.ndarray, length: int) -> np.ndarray:
    """For each interval, the last non-null phase of a step before its start (NaN if none)."""
    codes = _phase_codes(phases)
    n_int = -(-len(codes) // length)
    ends = np.arange(1, n_int) * length - 1  # the last step before each interval but the first
    seen = np.maximum.accumulate(np.where(np.isnan(codes), -1, np.arange(len(codes))))[ends]  # last labelled step
    out = np.full(n_int, np.nan)
    out[1:] = np.where(seen >= 0, codes[np.maximum(seen, 0)], np.nan)
    return out


def normalise_stats(phase_stats: Mapping | None) -> dict[int, Mapping]:
    out: dict[int, Mapping] = {}
    for key, value in (phase_stats or {}).items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            continue
    return out


def normalise_transitions(transitions: Any) -> dict[int, dict[int, float]]:
    """``{src: {dst: probability}}`` from ``{(src, dst): probability}`` or a ``phase_transitions`` table
    (pandas, or a small Spark DataFrame, with ``src``, ``dst``, ``probability``). Keys that are not phase numbers
    and non-finite probabilities are dropped; None gives ``{}``."""
    if transitions is None:
        return {}
    if hasattr(transitions, "toPandas"):
        transitions = transitions.toPandas()
    if isinstance(transitions, pd.DataFrame):
        missing = [c for c in ("src", "dst", "probability") if c not in transitions.columns]
        if missing:
            raise InputError(f"phase transitions lack column(s) {missing} (have: {list(transitions.columns)})")
        items = zip(zip(transitions["src"], transitions["dst"]), transitions["probability"])
    else:
        items = transitions.items()
    out: dict[int, dict[int, float]] = {}
    for key, prob in items:
        try:
            src, dst = (int(k) for k in key)
        except (TypeError, ValueError):
            continue
        p = finite_value(prob)
        if not math.isnan(p):
            out.setdefault(src, {})[dst] = p
    return out


def finite_value(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _phase_values(stats: Mapping[int, Mapping], phase: int, resource: str, limits: np.ndarray) -> np.ndarray:
    """A phase's statistic for ``resource`` at each of ``limits``: its share of the container's limit or its
    absolute value; NaN where the phase has none (the caller falls back to the limit)."""
    entry = stats.get(phase)
    if not isinstance(entry, Mapping):
        return np.full(len(limits), math.nan)
    if f"{resource}_fraction" in entry:  # a share of this container's limit
        return finite_value(entry[f"{resource}_fraction"]) * limits
    return np.full(len(limits), finite_value(entry.get(resource)))


def _interval_starts(n: int, length: int) -> np.ndarray:
    """Each interval's first step (the last step for a trace shorter than one interval is the same)."""
    return np.minimum(np.arange(-(-n // length)) * length, max(n - 1, 0))


def _phase_decisions(
    phases: np.ndarray, lim: np.ndarray, length: int, params: PolicyParams, stats: Mapping[int, Mapping],
    resource: str, successors: Mapping[int, Mapping[int, float]] | None,
) -> np.ndarray:
    """``phase.rule`` (``successors`` None) or ``phase.proactive``: per interval, the max statistic of the current
    phase and of its successors with probability >= ``proactive_threshold``, times ``1 + margin``; NaN when any
    of them has no statistic. One numpy pass per phase seen, not per interval: a replay asks for every margin."""
    current = _phase_before(phases, length)
    limits = lim[_interval_starts(len(phases), length)]
    decision = np.full(len(current), np.nan)
    threshold = float(params.proactive_threshold)
    for p in np.unique(current[~np.isnan(current)]):
        at = current == p
        wanted = [int(p)]
        if successors is not None:
            wanted += sorted(q for q, prob in successors.get(int(p), {}).items() if prob >= threshold)
        best = _phase_values(stats, wanted[0], resource, limits[at])
        for q in wanted[1:]:
            best = np.maximum(best, _phase_values(stats, q, resource, limits[at]))  # NaN if any is NaN
        decision[at] = best * (1.0 + float(params.margin))
    return decision


def _headroom(stats: Mapping[int, Mapping], phase: int, resource: str, quantile: float) -> float:
    """Phase ``phase``'s learned headroom for ``resource`` (a share of the limit) at ``quantile``, read from its
    quantile table at :data:`HEADROOM_LEVELS` by linear interpolation; NaN without a usable table."""
    entry = stats.get(phase)
    table = entry.get(f"{resource}_headroom") if isinstance(entry, Mapping) else None
    if table is None:
        return math.nan
    values = np.asarray(table, dtype=float)
    if values.shape != (len(HEADROOM_LEVELS),) or not np.isfinite(values).all():
        return math.nan
    return float(np.interp(quantile, HEADROOM_LEVELS, values))


def _headroom_decisions(
    usage: np.ndarray, phases: np.ndarray, lim: np.ndarray, length: int, params: PolicyParams,
    stats: Mapping[int, Mapping], resource: str,
) -> np.ndarray:
    """``phase.headroom``: per interval, the previous interval's max plus the current phase's learned headroom
    times the limit at the interval's start."""
    current = _phase_before(phases, length)
    prev_max = np.concatenate([[np.nan], _interval_stat(usage, length, "max", 0.0)[:-1]])
    limits = lim[_interval_starts(len(usage), length)]
    decision = np.full(len(current), np.nan)
    q = float(params.headroom_quantile)
    for p in np.unique(current[~np.isnan(current)]):  # each phase's table read once
        at = (current == p) & ~np.isnan(prev_max)
        decision[at] = prev_max[at] + _headroom(stats, int(p), resource, q) * limits[at]
    return decision


def jumps_of(usage: np.ndarray, limit: np.ndarray, phases: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """What ``phase.headroom`` learns from one container: for every interval ``i >= 1`` with a phase before it
    and known usage in both intervals, that phase and ``(max_i - max_{i-1}) / limit`` (the limit at the start
    of interval ``i``). Returns ``(phases, jumps)``, same length, intervals in order.

    >>> p, j = jumps_of(np.array([1.0, 2, 5, 5, 4, 3]), np.full(6, 10.0), np.array([0, 0, 1, 1, 1, 1]), 2)
    >>> p.tolist(), j.tolist()
    ([0.0, 1.0], [0.3, -0.1])
    """
    n = len(usage)
    maxima = _interval_stat(np.asarray(usage, dtype=float), length, "max", 0.0)
    current = _phase_before(phases, length)
    starts = np.minimum(np.arange(len(maxima)) * length, max(n - 1, 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        jump = (maxima[1:] - maxima[:-1]) / np.asarray(limit, dtype=float)[starts[1:]]
    keep = ~np.isnan(current[1:]) & np.isfinite(jump)
    return current[1:][keep], jump[keep]


JUMP_COLUMNS: tuple[str, ...] = ("phase", "resource", "jump")


def container_jumps(pdf: pd.DataFrame, params: PolicyParams | None = None) -> pd.DataFrame:
    """:func:`jumps_of` for both resources of one container's ``PHASES`` rows, read as the replay reads them
    (:func:`replay_frame`): columns :data:`JUMP_COLUMNS`, one row per (interval, resource). The fleet's jumps come
    from Spark's aggregations (:func:`ai4dl.policies.fleet.phase_jumps`), tested equal to this."""
    params = params or PolicyParams()
    if pdf is None or len(pdf) == 0:
        return pd.DataFrame({"phase": pd.Series(dtype="int64"), "resource": pd.Series(dtype="object"),
                             "jump": pd.Series(dtype="float64")})
    trace = _trace(pdf, params)
    if trace.phases is None:
        return container_jumps(None)
    parts = []
    for resource in RESOURCES:
        ph, jump = jumps_of(trace.usage[resource], trace.limit[resource], trace.phases, int(params.interval_steps))
        parts.append(pd.DataFrame({"phase": ph.astype("int64"), "resource": resource, "jump": jump}))
    return pd.concat(parts, ignore_index=True)[list(JUMP_COLUMNS)]


def headroom_tables(phases: np.ndarray, jumps: np.ndarray) -> dict[int, list[float]]:
    """``{phase: quantiles of its jumps at HEADROOM_LEVELS}``: the in-memory counterpart of the Spark
    aggregation :func:`ai4dl.policies.fleet.phase_headroom_stats` (for tests, notebooks and small fleets)."""
    out: dict[int, list[float]] = {}
    phases, jumps = np.asarray(phases, dtype=float), np.asarray(jumps, dtype=float)
    for p in np.unique(phases[~np.isnan(phases)]):
        out[int(p)] = np.quantile(jumps[phases == p], HEADROOM_LEVELS).tolist()
    return out


def _vpa_decisions(
    usage: np.ndarray, lim: np.ndarray, length: int, params: PolicyParams, resource: str, ts_seconds: np.ndarray | None,
    percentiles: Sequence[float] | None = None,
) -> np.ndarray:
    """Per interval, the real VPA recommender's target for ``resource`` given the samples before the interval
    (NaN before its first sample), with the memory closed loop of the module docstring.

    ``percentiles``: the targets at each of these percentiles instead of ``params.vpa_percentile``, shape
    (len(percentiles), intervals). The samples are converted to VPA's clock and units once for all of them. CPU
    samples do not depend on what was allocated: every interval's and percentile's CPU target comes from one pass
    (:func:`~ai4dl.policies.vpa.cpu_targets`). Memory's OOM samples do, so memory feeds one recommender per
    percentile, interval by interval; an interval whose samples all stay under the allocation in force and under
    the current window's peak changes nothing but the recommender's last sample time, which is decided from the
    interval's maximum (:meth:`~ai4dl.policies.vpa.VpaRecommender.add_quiet_memory_run`) instead of sample by
    sample, and a target is asked again only when the histogram has changed."""
    n = len(usage)
    n_int = -(-n // length)
    timed = ts_seconds is not None
    is_mem = resource == "mem"
    vpa_params = params.vpa(timed)
    if percentiles is None:
        asked = [vpa_params.target_memory_percentile if is_mem else vpa_params.target_cpu_percentile]
    else:
        asked = [float(q) for q in percentiles]
    decisions = np.full((len(asked), n_int), np.nan)
    # The samples VPA gets, in step order: unknown or negative usage and (timed) unknown times are no sample.
    usable = (usage >= 0) if not timed else (usage >= 0) & ~np.isnan(ts_seconds)
    kept_arr = np.flatnonzero(usable)
    kept = kept_arr.tolist()
    values = usage.tolist()
    times = ts_seconds.tolist() if timed else None
    step_seconds = float(params.vpa_step_seconds)
    at = [VpaRecommender.time_ns(times[k]) if timed else VpaRecommender.time_ns(step=k, step_seconds=step_seconds)
          for k in kept]
    amount = [(VpaRecommender.memory_amount if is_mem else VpaRecommender.cpu_amount)(values[k]) for k in kept]
    bounds = np.searchsorted(kept_arr, np.arange(n_int + 1) * length).tolist()
    if not is_mem:
        if n_int > 1:
            decisions[:, 1:] = cpu_targets(at, amount, bounds[1:n_int], asked, vpa_params)
        return decisions[0] if percentiles is None else decisions

    limits = lim.tolist()
    summaries = _interval_summaries(usage, lim, kept_arr, bounds, at, amount)

    def feed(rec: VpaRecommender, i: int, decision: float) -> None:
        start, end = bounds[i], bounds[i + 1]
        if start == end:
            return
        limit, peak_usage, first_ns, last_ns, peak_amount, forward = summaries[i]
        if limit == limit:  # one known limit over the interval: an OOM iff its highest sample is above the allocation
            if not peak_usage > _in_force(decision, limit):
                if not (forward and rec.add_quiet_memory_run(first_ns, last_ns, peak_amount)):
                    rec.add_memory_run(at, amount, start, end)
                return
        for j in range(start, end):  # the interval's first sample above the allocation in force is an OOM kill
            k = kept[j]
            in_force = _in_force(decision, limits[k])
            if values[k] > in_force:
                rec.add_memory_run(at, amount, start, j)
                rec.record_oom_at(at[j], in_force)
                start = j
                break
        rec.add_memory_run(at, amount, start, end)

    for j, q in enumerate(asked):
        rec = VpaRecommender(vpa_params)
        version, target = -1, None
        for i in range(n_int):
            if i > 0:
                if rec.state_version != version:  # the target is a function of the histogram alone
                    version, target = rec.state_version, rec.target(resource, q)
                if target is not None:
                    decisions[j, i] = target
            feed(rec, i, decisions[j, i])
    return decisions[0] if percentiles is None else decisions


def _in_force(decision: float, limit: float) -> float:
    """The allocation :func:`_cap` gives one step: the decision capped at the limit (a NaN limit does not cap), the
    limit without a decision, >= 0; NaN with neither."""
    alloc = limit if decision != decision else (decision if limit != limit else min(decision, limit))
    return max(alloc, 0.0) if alloc == alloc else alloc


def _interval_summaries(
    usage: np.ndarray, lim: np.ndarray, kept: np.ndarray, bounds: list[int], at: list[int], amount: list[int]
) -> list[tuple]:
    """Per interval, what the memory loop's short paths need: (its limit, NaN unless one known number over the
    interval's samples; highest usage; first and last sample time; highest amount; whether the sample times never
    go backwards). Meaningless for an interval without samples."""
    n_int = len(bounds) - 1
    out: list[tuple] = [(math.nan, math.nan, 0, 0, 0, False)] * n_int
    starts, ends = np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    filled = np.flatnonzero(starts < ends)
    if not len(filled):
        return out
    first = starts[filled]  # each filled interval's samples run from its start to the next filled one's
    k_lim = lim[kept]
    top_limit = np.maximum.reduceat(k_lim, first)
    one_limit = np.where(top_limit == np.minimum.reduceat(k_lim, first), top_limit, np.nan).tolist()
    backwards = [b < a for a, b in zip(at, at[1:])]  # Python ints: Go's clock does not fit an int64
    reversals = np.concatenate([[0], np.cumsum(backwards, dtype=np.int64)])  # time going backwards among the first j samples
    forward = (reversals[ends[filled] - 1] == reversals[first]).tolist()
    peak_usage = np.maximum.reduceat(usage[kept], first).tolist()
    peak_amount = np.maximum.reduceat(np.asarray(amount, dtype=np.int64), first).tolist()
    for c, i in enumerate(filled.tolist()):
        out[i] = (one_limit[c], peak_usage[c], at[bounds[i]], at[bounds[i + 1] - 1], peak_amount[c], forward[c])
    return out


def allocate(
    policy: str,
    usage: np.ndarray,
    limit: np.ndarray | float,
    params: PolicyParams,
    phases: np.ndarray | None = None,
    phase_stats: dict | None = None,
    resource: str = "cpu",
    ts_seconds: np.ndarray | None = None,
    transitions: Any = None,
) -> np.ndarray:
    """Per-step allocation of ``policy`` over one container's trace (``usage`` in step order, NaN = unknown).

    ``limit`` is a scalar or a per-step array; every allocation is ``min(decision, limit)`` and ``>= 0``, and
    an interval without a decision (first interval of a reactive policy, no phase, no history) gets the limit.
    ``phases`` (per step, None/NaN = unlabelled) and ``phase_stats`` (``{phase: {"cpu": v, "mem": v}}`` or
    ``{phase: {"cpu_fraction": f, "mem_fraction": f}}``, and for ``phase.headroom`` ``"cpu_headroom"`` /
    ``"mem_headroom"`` quantile tables) are used by the phase policies, ``transitions``
    (``{(src, dst): probability}``, see :func:`normalise_transitions`) by ``phase.proactive``; ``resource`` picks
    the statistic and, for ``vpa``, the target. ``ts_seconds`` (per step, seconds, NaN = unknown) is ``vpa``'s
    clock; without it sample k is at ``k * vpa_step_seconds``.
    """
    if policy not in POLICIES:
        raise InputError(f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
    if resource not in RESOURCES:
        raise InputError(f"unknown resource '{resource}' (known: {', '.join(RESOURCES)})")
    u = np.asarray(usage, dtype=float).ravel()
    n = len(u)
    lim = _as_limit(limit, n)
    if n == 0:
        return np.zeros(0)
    length = int(params.interval_steps)
    n_int = -(-n // length)

    if policy == "static":
        decision = np.full(n_int, np.nan)
    elif policy == "current.step.max":
        decision = _interval_stat(u, length, "max", 0.0)
    elif policy == "current.step.rules":
        decision = _interval_stat(u, length, "rules", float(params.k_std))
    elif policy == "prev.step.max":
        stat = _interval_stat(u, length, "max", 0.0) * (1.0 + float(params.prev_max_margin))
        decision = np.concatenate([[np.nan], stat[:-1]])
    elif policy == "prev.step.rules":
        stat = _interval_stat(u, length, "rules", float(params.k_std))
        decision = np.concatenate([[np.nan], stat[:-1]])
    elif policy in ("phase.rule", "phase.proactive"):
        decision = np.full(n_int, np.nan)
        if phases is not None:
            ph = _per_step("phases", _phase_codes(phases), n)
            successors = normalise_transitions(transitions) if policy == "phase.proactive" else None
            decision = _phase_decisions(ph, lim, length, params, normalise_stats(phase_stats), resource, successors)
    elif policy == "phase.headroom":
        decision = np.full(n_int, np.nan)
        if phases is not None:
            ph = _per_step("phases", _phase_codes(phases), n)
            decision = _headroom_decisions(u, ph, lim, length, params, normalise_stats(phase_stats), resource)
    else:  # vpa
        ts = None if ts_seconds is None else _per_step("ts_seconds", ts_seconds, n)
        decision = _vpa_decisions(u, lim, length, params, resource, ts)

    return _cap(np.repeat(decision, length)[:n], lim)


def step_durations(ts_seconds: np.ndarray | None, n: int, default_seconds: float) -> np.ndarray:
    """Seconds each of ``n`` steps lasts: the time to the next step's timestamp. Where that is unknown (the last
    step, a step next to a missing timestamp) it is the median of the known durations, or ``default_seconds``
    without any (no timestamps, a one-step trace): a sample stands for the time until the next one.

    >>> step_durations(np.array([0.0, 30.0, 60.0, 120.0]), 4, 10.0).tolist()
    [30.0, 30.0, 60.0, 30.0]
    >>> step_durations(None, 2, 10.0).tolist()
    [10.0, 10.0]
    """
    if ts_seconds is None or n < 2:
        return np.full(n, float(default_seconds))
    d = np.append(np.diff(np.asarray(ts_seconds, dtype=float)), np.nan)
    known = np.isfinite(d)
    fill = float(np.median(d[known])) if known.any() else float(default_seconds)
    return np.where(known, d, fill)


def _metrics(usage: np.ndarray, alloc: np.ndarray, limit: np.ndarray, resource: str, durations: np.ndarray) -> dict[str, Any]:
    ok = ~np.isnan(usage) & ~np.isnan(limit) & ~np.isnan(alloc)
    u, a, lim = usage[ok], alloc[ok], limit[ok]
    short = np.maximum(u - a, 0.0)
    met = int(np.count_nonzero(a >= u))
    steps = int(ok.sum())
    cpu = resource == "cpu"
    return {
        "steps": steps,
        "used": float(u.sum()),
        "allocated": float(a.sum()),
        "static_allocated": float(lim.sum()),
        "met_steps": met,
        "shortfall_steps": steps - met,
        "shortfall_total": float(short.sum()),
        "shortfall_max": float(short.max()) if steps else 0.0,
        "oom_kills": 0 if cpu else steps - met,
        "throttled_steps": steps - met if cpu else 0,
        "throttled_core_seconds": float((short * durations[ok]).sum()) if cpu else 0.0,
    }


def _typed(df: pd.DataFrame, declared: tuple[tuple[str, str, bool], ...] = POLICY_REPLAY_FIELDS) -> pd.DataFrame:
    for name, sql_type, _ in declared:
        if sql_type in _PANDAS_DTYPES:
            df[name] = df[name].astype(_PANDAS_DTYPES[sql_type])
    return df


def timestamps_seconds(df: pd.DataFrame) -> np.ndarray | None:
    """Unix seconds (float, NaN = unknown) of a frame's ``ts`` column, datetimes (naive ones read as UTC) or
    numbers; None when the frame has no known timestamp (the replay then counts steps)."""
    if "ts" not in df.columns:
        return None
    ts = df["ts"]
    if pd.api.types.is_numeric_dtype(ts):
        out = pd.to_numeric(ts, errors="coerce").to_numpy(dtype=float)
    else:
        t = pd.to_datetime(ts, errors="coerce", utc=True)
        out = ((t - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(dtype=float)
    return out if np.isfinite(out).any() else None


def replay_frame(pdf: pd.DataFrame) -> pd.DataFrame:
    """One container's rows as every replay reads them: sorted by ``step``, duplicate steps keep their first
    row, missing steps between the first and the last are reindexed as unknown rows (so intervals stay aligned
    with the step numbers)."""
    df = pdf.sort_values("step", kind="stable").drop_duplicates("step", keep="first")
    steps = df["step"].astype("int64").to_numpy()
    span = np.arange(steps[0], steps[-1] + 1)
    return df.set_index(pd.Index(steps)).reindex(span)


@dataclass(frozen=True)
class _Trace:
    """One container's arrays, prepared once for all the policies and knob values replayed over it."""

    key: dict[str, Any]  # pod_id, service
    phases: np.ndarray | None
    ts_seconds: np.ndarray | None
    durations: np.ndarray
    usage: dict[str, np.ndarray]
    limit: dict[str, np.ndarray]


def _trace(pdf: pd.DataFrame, params: PolicyParams) -> _Trace:
    df = replay_frame(pdf)
    service = pdf["service"].dropna().iloc[0] if "service" in pdf and pdf["service"].notna().any() else None
    ts = timestamps_seconds(df)
    return _Trace(
        key={"pod_id": str(pdf["pod_id"].iloc[0]), "service": service},
        phases=_phase_codes(df["phase"].to_numpy(dtype=object)) if "phase" in df else None,
        ts_seconds=ts,
        durations=step_durations(ts, len(df), float(params.vpa_step_seconds)),
        usage={r: pd.to_numeric(df[u], errors="coerce").to_numpy(dtype=float) for r, (u, _) in RESOURCES.items()},
        limit={
            r: pd.to_numeric(df[c], errors="coerce").ffill().bfill().to_numpy(dtype=float)
            for r, (_, c) in RESOURCES.items()
        },
    )


def _replay_rows(
    trace: _Trace, policy: str, params: PolicyParams, phase_stats: Mapping | None, transitions: Any,
    decided: Mapping[str, np.ndarray] | None = None,
) -> list[dict]:
    """One row per resource; ``decided`` gives a resource's per-interval decisions already computed (VPA's CPU
    targets for a whole knob grid), allocated as :func:`allocate` would."""
    rows = []
    for resource in RESOURCES:
        usage, limit = trace.usage[resource], trace.limit[resource]
        if decided is not None and resource in decided:
            lim = _as_limit(limit, len(usage))
            alloc = _cap(np.repeat(decided[resource], int(params.interval_steps))[: len(usage)], lim)
        else:
            alloc = allocate(policy, usage, limit, params, trace.phases, phase_stats, resource, trace.ts_seconds, transitions)
        rows.append({**trace.key, "policy": policy, "resource": resource,
                     **_metrics(usage, alloc, limit, resource, trace.durations)})
    return rows


def _frame(rows: list[dict], declared: tuple[tuple[str, str, bool], ...]) -> pd.DataFrame:
    columns = [name for name, _, _ in declared]
    if not rows:
        return _typed(pd.DataFrame({c: pd.Series(dtype="object") for c in columns}), declared)
    return _typed(pd.DataFrame(rows, columns=columns), declared)


def replay_container(
    pdf: pd.DataFrame, params: PolicyParams | None = None, phase_stats: Mapping | None = None, transitions: Any = None
) -> pd.DataFrame:
    """Replay one container's ``PHASES`` rows under every policy: one row per (policy, resource), columns
    :data:`REPLAY_COLUMNS`. Rows are read as :func:`replay_frame` says; the ``ts`` column, when present, is
    ``vpa``'s clock and gives the step durations of ``throttled_core_seconds``."""
    params = params or PolicyParams()
    if pdf is None or len(pdf) == 0:
        return _frame([], POLICY_REPLAY_FIELDS)
    trace = _trace(pdf, params)
    rows = [row for policy in POLICIES for row in _replay_rows(trace, policy, params, phase_stats, transitions)]
    return _frame(rows, POLICY_REPLAY_FIELDS)


def knob_grids(knobs: Mapping[str, Sequence[float]] | None = None) -> dict[str, tuple[float, ...]]:
    """Each policy of :data:`KNOBS` with its grid: the default one, or the values ``knobs`` gives for it."""
    grids = {policy: grid for policy, (_, grid) in KNOBS.items()}
    for policy, values in (knobs or {}).items():
        if policy not in KNOBS:
            raise InputError(f"policy '{policy}' has no knob (policies with one: {', '.join(KNOBS)})")
        grid = tuple(float(v) for v in values)
        if not grid:
            raise InputError(f"the knob grid of '{policy}' is empty")
        grids[policy] = grid
    return grids


def replay_container_grid(
    pdf: pd.DataFrame,
    params: PolicyParams | None = None,
    phase_stats: Mapping | None = None,
    transitions: Any = None,
    knobs: Mapping[str, Sequence[float]] | None = None,
    policies: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Replay one container under every policy (or those of ``policies``) and every value of its knob: one row
    per (policy, knob value, resource), columns :data:`FRONTIER_COLUMNS` (``knob`` NaN for the policies without
    one, replayed once).

    ``knobs`` maps a policy of :data:`KNOBS` to the values to try instead of its default grid; every other
    parameter is ``params``'. Summed over containers, these rows are what :func:`choose_knob` calibrates on.
    """
    params = params or PolicyParams()
    grids = knob_grids(knobs)
    unknown = [p for p in (policies or ()) if p not in POLICIES]
    if unknown:
        raise InputError(f"unknown policies {unknown} (known: {', '.join(POLICIES)})")
    if pdf is None or len(pdf) == 0:
        return _frame([], POLICY_FRONTIER_FIELDS)
    trace = _trace(pdf, params)
    rows = []
    for policy in POLICIES if policies is None else [p for p in POLICIES if p in policies]:
        if policy not in KNOBS:
            rows += [{**r, "knob": math.nan} for r in _replay_rows(trace, policy, params, phase_stats, transitions)]
            continue
        name = KNOBS[policy][0]
        shared = {}
        if policy == "vpa":  # every percentile's targets from one conversion of the samples (CPU: one recommender)
            for resource in RESOURCES:
                u = trace.usage[resource]
                if len(u):
                    ts = None if trace.ts_seconds is None else _per_step("ts_seconds", trace.ts_seconds, len(u))
                    shared[resource] = _vpa_decisions(u, _as_limit(trace.limit[resource], len(u)),
                                                      int(params.interval_steps), params, resource, ts, grids[policy])
        for j, value in enumerate(grids[policy]):
            tuned = dataclasses.replace(params, **{name: value})
            decided = {resource: targets[j] for resource, targets in shared.items()} or None
            rows += [{**r, "knob": value} for r in _replay_rows(trace, policy, tuned, phase_stats, transitions, decided)]
    return _frame(rows, POLICY_FRONTIER_FIELDS)


@dataclass(frozen=True)
class ServiceLevel:
    """The service level policies are compared at, per resource: the share of steps that get at least their
    usage (``cpu_fulfilment``, ``mem_fulfilment``), or for memory, when ``oom_kills_per_100`` is set, an OOM
    budget instead: at most that many OOM kills per 100 containers (a platform team often states memory that way).

    >>> ServiceLevel.of(0.9).describe("mem"), ServiceLevel(oom_kills_per_100=20).describe("mem")
    ('90% of steps met', '<= 20 OOM kills per 100 containers')
    """

    cpu_fulfilment: float = 0.95
    mem_fulfilment: float = 0.95
    oom_kills_per_100: float | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_fulfilment", "mem_fulfilment"):
            if not 0.0 <= finite_value(getattr(self, name)) <= 1.0:
                raise InputError(f"ServiceLevel.{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.oom_kills_per_100 is not None and not finite_value(self.oom_kills_per_100) >= 0.0:
            raise InputError(f"ServiceLevel.oom_kills_per_100 must be >= 0, got {self.oom_kills_per_100!r}")

    @classmethod
    def of(cls, target: "float | ServiceLevel") -> "ServiceLevel":
        """A service level as given, or one fulfilment for both resources."""
        if isinstance(target, ServiceLevel):
            return target
        share = finite_value(target)
        if not 0.0 <= share <= 1.0:
            raise InputError(f"target_fulfilment must be in [0, 1], got {target!r}")
        return cls(cpu_fulfilment=share, mem_fulfilment=share)

    @classmethod
    def from_config(cls, section: Any) -> "ServiceLevel":
        """From the ``policies`` config section: ``target_fulfilment``, overridden per resource by
        ``target_fulfilment_cpu`` / ``target_fulfilment_mem``, and ``oom_budget_per_100``."""
        get = section.get if isinstance(section, Mapping) else lambda k, d=None: getattr(section, k, d)
        both = float(get("target_fulfilment", 0.95))
        cpu, mem = get("target_fulfilment_cpu"), get("target_fulfilment_mem")
        return cls(cpu_fulfilment=both if cpu is None else float(cpu), mem_fulfilment=both if mem is None else float(mem),
                   oom_kills_per_100=get("oom_budget_per_100"))

    def by_oom(self, resource: str) -> bool:
        return resource == "mem" and self.oom_kills_per_100 is not None

    def fulfilment(self, resource: str) -> float:
        """The fulfilment target of ``resource`` (NaN when memory is held to an OOM budget instead)."""
        if self.by_oom(resource):
            return math.nan
        return float(self.cpu_fulfilment if resource == "cpu" else self.mem_fulfilment)

    def describe(self, resource: str) -> str:
        if self.by_oom(resource):
            return f"<= {self.oom_kills_per_100:g} OOM kills per 100 containers"
        return f"{self.fulfilment(resource):.0%} of steps met"


# The replay's numeric columns that add up over containers (shortfall_max is a max, not a sum).
_ADDITIVE = tuple(name for name, sql_type, _ in POLICY_REPLAY_FIELDS if sql_type in _PANDAS_DTYPES and name != "shortfall_max")


def choose_knob(frame: pd.DataFrame, target_fulfilment: "float | ServiceLevel") -> pd.DataFrame:
    """Per (policy, resource), the knob value with the smallest ``allocated`` whose fulfilment (``met_steps /
    steps``) is at least ``target_fulfilment``: each policy at the matched service level, at its lowest cost.
    ``target_fulfilment`` is one share for both resources or a :class:`ServiceLevel` (one per resource, or an
    OOM budget for memory: OOM kills per 100 containers at most the budget; containers are the ``containers``
    column summed, or the distinct ``pod_id`` values; without a budget met, the fewest kills win).

    ``frame`` holds rows of (``policy``, ``resource``, ``knob``) with at least ``steps``, ``met_steps`` and
    ``allocated`` (e.g. :func:`replay_container_grid`'s rows of many containers, or totals already summed per
    knob in Spark); rows of the same (policy, resource, knob) are summed first, as are the other additive replay
    columns present (``oom_kills``, ``throttled_core_seconds``...). A knob-less policy (``knob`` NaN) has one
    candidate. When no value reaches the target, the most generous one is returned: the highest fulfilment
    (ties: the smaller allocation), flagged ``reached = False``. Ties in allocation go to the smaller knob.

    Returns one row per (policy, resource), ordered by resource then :data:`POLICIES`: ``policy``,
    ``resource``, ``knob_name`` (the :class:`PolicyParams` field, None without a knob), ``knob``, the summed
    columns, ``fulfilment`` and ``reached``.
    """
    level = ServiceLevel.of(target_fulfilment)
    missing = [c for c in ("policy", "resource", "knob", "steps", "met_steps", "allocated") if c not in frame.columns]
    if level.oom_kills_per_100 is not None:
        missing += [c for c in ("oom_kills",) if c not in frame.columns]
        if "containers" not in frame.columns and "pod_id" not in frame.columns:
            missing.append("containers (or pod_id)")
    if missing:
        raise InputError(f"choose_knob: the frame lacks column(s) {missing} (have: {list(frame.columns)})")
    keys = ["policy", "resource", "knob"]
    summed = [c for c in _ADDITIVE if c in frame.columns] + (["containers"] if "containers" in frame.columns else [])
    totals = frame.groupby(keys, dropna=False, sort=True)[summed].sum().reset_index()
    if "containers" not in totals.columns and "pod_id" in frame.columns:
        counted = frame.groupby(keys, dropna=False, sort=True)["pod_id"].nunique().reset_index(name="containers")
        totals = totals.merge(counted, on=keys, how="left")
    steps = totals["steps"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        totals["fulfilment"] = np.where(steps > 0, totals["met_steps"].to_numpy(dtype=float) / steps, np.nan)
        if "containers" in totals.columns and "oom_kills" in totals.columns:
            n = totals["containers"].to_numpy(dtype=float)
            totals["oom_kills_per_100"] = np.where(n > 0, 100.0 * totals["oom_kills"].to_numpy(dtype=float) / n, np.nan)
    wanted = totals["resource"].map(level.fulfilment).to_numpy(dtype=float)
    totals["reached"] = totals["fulfilment"].to_numpy() >= wanted  # NaN (no steps) never reaches
    if level.oom_kills_per_100 is not None:
        by_oom = (totals["resource"] == "mem").to_numpy()
        within = totals["oom_kills_per_100"].to_numpy(dtype=float) <= float(level.oom_kills_per_100)
        totals["reached"] = np.where(by_oom, within, totals["reached"].to_numpy())

    picks = []
    for (_, resource), group in totals.groupby(["policy", "resource"], sort=False):
        if group["reached"].any():
            best = group[group["reached"]].sort_values(["allocated", "knob"], kind="stable").iloc[0]
        elif level.by_oom(resource):
            best = group.sort_values(["oom_kills_per_100", "allocated", "knob"], na_position="last", kind="stable").iloc[0]
        else:
            best = group.sort_values(["fulfilment", "allocated", "knob"], ascending=[False, True, True],
                                     na_position="last", kind="stable").iloc[0]
        picks.append(best)
    out = pd.DataFrame(picks).reset_index(drop=True)
    out.insert(2, "knob_name", [KNOBS[p][0] if p in KNOBS else None for p in out["policy"]])
    order = {p: i for i, p in enumerate(POLICIES)}
    out["_order"] = [order.get(p, len(order)) for p in out["policy"]]
    out = out.sort_values(["resource", "_order", "policy"], kind="stable").drop(columns="_order").reset_index(drop=True)
    out["reached"] = out["reached"].astype(bool)
    return out


def most_likely_next(phase: Any, transitions: Any) -> tuple[int, float] | None:
    """The most likely phase after a run of ``phase`` and its probability: ``argmax_q P(phase -> q)`` over
    ``q != phase`` (ties: the smallest phase), None for an unknown phase or one without known successors.
    ``transitions`` as :func:`normalise_transitions` reads them. The one rule both the next-phase score
    (:func:`next_phase_f1`) and the live recommendations (:mod:`ai4dl.stream`) predict with.

    >>> most_likely_next(0, {(0, 1): 0.7, (0, 2): 0.3, (0, 0): 0.9})
    (1, 0.7)
    >>> most_likely_next(None, {(0, 1): 1.0}) is None
    True
    """
    p = finite_value(phase)
    if math.isnan(p):
        return None
    successors = transitions if _is_normalised(transitions) else normalise_transitions(transitions)
    candidates = [(-prob, dst) for dst, prob in successors.get(int(p), {}).items() if dst != int(p)]
    if not candidates:
        return None
    prob, dst = min(candidates)
    return int(dst), -float(prob)


def _is_normalised(transitions: Any) -> bool:
    return isinstance(transitions, dict) and all(isinstance(v, dict) for v in transitions.values())


# Policies that read the interval they allocate for: they cannot run live, where that interval is the future.
ORACLES: tuple[str, ...] = ("current.step.max", "current.step.rules")


def next_allocation(
    pdf: pd.DataFrame, policy: str, params: PolicyParams | None = None, phase_stats: Mapping | None = None,
    transitions: Any = None,
) -> dict[str, Any]:
    """What ``policy`` allocates for the step after the last row of one container's ``PHASES`` rows ``pdf``:
    ``{"step", "interval", "cpu", "mem", "cpu_limit", "mem_limit"}``.

    This is the replay itself (:func:`allocate` over the same :func:`replay_frame`), run over the rows known so
    far plus one unknown step: every non-oracle policy decides an interval from steps before it, so the result
    is the allocation the replay of the whole trace holds at that step (the live recommendation and the batch
    replay cannot drift apart). The unknown step's limit is the last known one (limits are per-container
    constants in practice). Oracles need the interval's own usage and are refused.
    """
    params = params or PolicyParams()
    if policy in ORACLES or policy not in POLICIES:
        raise InputError(f"policy '{policy}' cannot allocate ahead of time (allowed: "
                         f"{', '.join(p for p in POLICIES if p not in ORACLES)})")
    if pdf is None or len(pdf) == 0:
        raise InputError("next_allocation needs at least one known step")
    nxt = int(pd.to_numeric(pdf["step"]).max()) + 1
    extended = pd.concat([pdf, pdf.iloc[[-1]]], ignore_index=True)  # the unknown step, blanked below
    last = len(extended) - 1
    for col in ("step", *(c for pair in RESOURCES.values() for c in pair)):
        if col in extended:
            extended[col] = pd.to_numeric(extended[col], errors="coerce").astype("float64")
    extended.loc[last, "step"] = nxt
    for col in ("ts", "phase", *(u for u, _ in RESOURCES.values()), *(c for _, c in RESOURCES.values())):
        if col in extended:
            extended.loc[last, col] = None
    trace = _trace(extended, params)
    first = nxt - len(trace.limit["cpu"]) + 1  # replay_frame's first step: interval 0 starts there
    out: dict[str, Any] = {"step": nxt, "interval": (nxt - first) // int(params.interval_steps)}
    for resource in RESOURCES:
        usage, limit = trace.usage[resource], trace.limit[resource]
        alloc = allocate(policy, usage, limit, params, trace.phases, phase_stats, resource, trace.ts_seconds, transitions)
        out[resource] = float(alloc[-1])
        out[f"{resource}_limit"] = float(limit[-1])
    return out


def f1_scores(boundaries: int, predicted: int, correct: int) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 of next-phase predictions from their counts (NaN when
    undefined), so per-container counts can be summed over a fleet first.

    >>> f1_scores(boundaries=4, predicted=3, correct=2)
    {'precision': 0.6666666666666666, 'recall': 0.5, 'f1': 0.5714285714285715}
    """
    precision = correct / predicted if predicted else math.nan
    recall = correct / boundaries if boundaries else math.nan
    if math.isnan(precision) or math.isnan(recall):
        f1 = math.nan
    elif precision + recall == 0:
        f1 = 0.0
    else:
        f1 = 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1}


def next_phase_f1(phases: Any, transitions: Any) -> dict[str, float]:
    """How well the transition probabilities predict a container's next phase (what ``phase.proactive`` bets on).

    The phase sequence without its unlabelled steps is cut into runs of one phase. At every run end (a phase
    change, a *boundary*) the prediction for the next run's phase is the most likely successor
    ``argmax_q P(p -> q)`` over ``q != p`` of the ending run's phase ``p`` (ties: the smallest phase); a phase
    without known successors predicts nothing. Over the boundaries: ``correct`` = predictions equal to the
    actual next phase, precision = correct / predicted, recall = correct / boundaries, F1 their harmonic mean
    (micro-averaged over phases: one prediction per boundary). Counts are returned too, for fleet sums.

    >>> scores = next_phase_f1([0, 0, None, 0, 1, 1, 0, 2, 2], {(0, 1): 0.7, (0, 2): 0.3, (1, 0): 1.0})
    >>> scores["boundaries"], scores["predicted"], scores["correct"], round(scores["f1"], 4)
    (3, 3, 2, 0.6667)
    """
    codes = _phase_codes(phases)
    codes = codes[~np.isnan(codes)].astype(np.int64)
    runs = codes[np.r_[True, codes[1:] != codes[:-1]]] if codes.size else codes
    successors = normalise_transitions(transitions)
    best = {src: nxt[0] for src in successors if (nxt := most_likely_next(src, successors)) is not None}
    boundaries = max(len(runs) - 1, 0)
    predicted = correct = 0
    for src, dst in zip(runs[:-1].tolist(), runs[1:].tolist()):
        if src in best:
            predicted += 1
            correct += int(best[src] == dst)
    return {"boundaries": boundaries, "predicted": predicted, "correct": correct, **f1_scores(boundaries, predicted, correct)}


# -------------------------------------------------------------------------------------------- Spark side


def phase_stats_for_policy(
    phase_stats_pdf: Any, quantile_cols: tuple[str, str] = ("cpu_p95", "mem_p95")
) -> dict[int, dict[str, float]]:
    """``{phase: {"cpu": v, "mem": v}}`` from a phase-statistics table (pandas, or a small Spark DataFrame).

    Only the fleet-wide rows (``service == "__all__"``) are used when the table has a ``service`` column;
    ``quantile_cols`` names the cpu and the mem statistic (e.g. ``("cpu_p99", "mem_p99")``). Rows with a null
    phase are dropped; a null statistic stays NaN, which ``phase.rule`` treats as missing (falls back to the limit).
    """
    pdf = phase_stats_pdf.toPandas() if hasattr(phase_stats_pdf, "toPandas") else pd.DataFrame(phase_stats_pdf)
    cpu_col, mem_col = quantile_cols
    missing = [c for c in ("phase", cpu_col, mem_col) if c not in pdf.columns]
    if missing:
        raise ValueError(f"phase statistics lack column(s) {missing} (have: {list(pdf.columns)})")
    if "service" in pdf.columns:
        pdf = pdf[pdf["service"] == "__all__"]
    pdf = pdf[pdf["phase"].notna()]
    return {int(r["phase"]): {"cpu": finite_value(r[cpu_col]), "mem": finite_value(r[mem_col])} for _, r in pdf.iterrows()}


_SUMMARY_FORMAT: tuple[tuple[str, str, int], ...] = (
    ("resource", "s", 8),
    ("policy", "s", 18),
    ("containers", "d", 10),
    ("savings_vs_static", "%", 17),
    ("savings_vs_prev_rules", "%", 21),
    ("fulfilment", "%", 10),
    ("utilisation", "%", 11),
    ("shortfall_steps", "d", 15),
    ("shortfall_total", "g", 15),
    ("shortfall_max", "g", 13),
)


def _cell(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "s":
        return str(value)
    if kind == "d":
        return f"{int(value):d}"
    if kind == "%":
        return f"{100.0 * float(value):.1f}%"
    return f"{float(value):.4g}"


def format_summary(summary_pdf: pd.DataFrame) -> str:
    """A fixed-width text table of :func:`summarise`'s result (as pandas); absent columns are left out."""
    cols = [(c, k, w) for c, k, w in _SUMMARY_FORMAT if c in summary_pdf.columns]
    widths = [max(w, len(c)) for c, _, w in cols]
    lines = ["  ".join(c.ljust(w) if k == "s" else c.rjust(w) for (c, k, _), w in zip(cols, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for _, row in summary_pdf.iterrows():
        cells = []
        for (c, k, _), w in zip(cols, widths):
            text = _cell(row[c], k)
            cells.append(text.ljust(w) if k == "s" else text.rjust(w))
        lines.append("  ".join(cells))
    return "\n".join(lines)

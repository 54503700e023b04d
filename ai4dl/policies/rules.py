"""The decision rules of the allocation policies: what each policy allocates for an interval, from what it knew
before that interval, and how a policy reacts to an OOM kill.

Time is cut into allocation intervals of ``interval_steps`` steps (interval ``i`` covers steps ``[i*L, (i+1)*L)``
of a container's trace). At the start of each interval a policy decides one allocation per resource (``cpu`` in
cores, ``mem`` in bytes) from what it has seen *before* the interval, and holds it for the interval:

``static``
    the container's limit (``cpu_num_cores`` / ``mem_limit``): the baseline every saving is measured against.
``current.step.max`` (oracle)
    the max of the coming interval's usage.
``current.step.rules`` (oracle)
    ``mean + k_std * std`` (population std) of the coming interval's usage; no margin.
``prev.step.max`` (reactive)
    the max of the previous interval's usage times ``1 + prev_max_margin``; the first interval gets the limit.
``prev.step.rules`` (reactive)
    ``mean + k_std * std`` of the previous interval; the first interval gets the limit.
``phase.rule``
    the container's phase is the last non-null phase of a step before the interval starts; the allocation is that
    phase's statistic times ``1 + margin``. A statistic is absolute (``{"cpu": cores, "mem": bytes}``) or a
    share of the limit (``{"cpu_fraction": f, "mem_fraction": f}``), multiplied by the container's limit at the
    last step before the interval (what is known when the decision is made), so one fleet statistic fits
    containers of every size. No phase yet, or a phase without a (finite) statistic: the limit.
``phase.proactive``
    ``phase.rule`` that also provisions for where the container is likely to go next: the max of the statistics
    of the current phase ``p`` and of every ``q`` with ``P(p -> q) >= proactive_threshold`` (the training
    containers' transition probabilities), times ``1 + margin``. The probabilities say which phase comes next,
    not when: the likely successors are provisioned for at every interval of a run.
``phase.headroom``
    the previous interval's max plus ``h(p) * limit``, ``h(p)`` the ``headroom_quantile`` (the knob) of the
    *jumps* seen after phase ``p`` on the training containers: for every interval ``i >= 1`` whose phase before
    it was ``p``, ``(max_i - max_{i-1}) / limit`` (:func:`jumps_of`), kept as a quantile table at
    :data:`HEADROOM_LEVELS` (``{"cpu_headroom": [...], "mem_headroom": [...]}``) and read by linear
    interpolation. No phase, no previous usage, or a phase without a table: the limit.
``forecast`` / ``phase.forecast``
    the previous interval's max plus a learned forecast of the coming jump, times the known limit: the median
    forecast, raised where the forecast is sure enough that covering it pays at ``forecast_miss_cost`` (the
    knob, the price of a missed interval in shares of the limit); the forecaster reads the last intervals'
    summaries (and, for ``phase.forecast``, the phase and how long it has lasted): :mod:`ai4dl.policies.forecast`.
``vpa`` (the Kubernetes VPA recommender, v1.8.1)
    the target of the real recommender (:class:`ai4dl.policies.vpa.VpaRecommender`) fed, in step order, every
    known sample before the interval, at ``vpa_percentile`` (the knob), with VPA's own margin
    (``vpa_margin``), half-lives and memory peak interval; its clock is the trace's timestamps. The first
    interval, or any interval before the resource's first sample, gets the limit.

Every allocation is capped at the container's limit (a recommender never allocates above what the container was
admitted with) and is ``>= 0``.

**Memory as a cluster sees it.** A container whose memory usage exceeds the allocation in force is OOM-killed:
an *event*, counted once, after which the policy reacts as it would on a real cluster and the container runs
on (restarted) under the new allocation for the rest of the interval (:func:`oom_step`):

* ``vpa``: the kill is reported to the recommender (``RecordOOM`` with the allocation in force as the request,
  before the step's sample), which bumps its memory histogram; the allocation becomes its new target, as VPA's
  updater applies a recommendation to a pod that was just OOM-killed.
* every other policy: the allocation becomes ``max(allocation, bump(usage))`` with VPA's own OOM bump,
  ``bump(u) = max(u + 100 MiB, 1.2 u)`` (:func:`oom_bump`), so each family pays for a kill the same way.

A step above an allocation that has not changed since the step before, which was itself above it (a container
stuck at its limit, which no reaction can raise), is the same kill, not a new one. The next interval's decision
is the policy's own rule again (VPA's histogram remembers the kill; a reactive rule sees the usage that caused
it). CPU is never killed: a step above its allocation is throttled, and counted in steps and core-seconds.

Each policy family has one knob (:data:`KNOBS`) trading allocation for service level: the policy model
(:mod:`ai4dl.policies.model`) calibrates it on training containers.

The functions below take per-interval arrays, so the batch replay (:mod:`ai4dl.policies.replay`, every interval
of a trace at once) and the live stream (:mod:`ai4dl.policies.live`, the coming interval, one-element arrays)
compute each decision with the same operations on the same numbers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ai4dl.config import PoliciesConfig
from ai4dl.policies.vpa import VpaParams

_MARGINS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
# the price of a missed interval, in shares of the limit, at which a forecaster stops raising its allocation:
# 0.005 to 92 in steps of a quarter (a forecaster's trees give few distinct widths, so the fleet's steps met
# move in jumps between neighbouring prices; a coarser grid overshoots the level), then a few prices up to 1e8
# for strict levels such as an OOM budget (the margin grows only as sqrt(ln price): 6.7 sigma at 1e8 for a
# forecast 1 % of the limit wide)
_FORECAST_MISS_COSTS = tuple(round(0.005 * 1.25 ** i, 6) for i in range(45)) + (300.0, 1e3, 1e4, 1e5, 1e6, 1e8)
# policy -> (the PoliciesConfig field that is its one knob, the default calibration grid, cheapest first). The
# oracles and static have no knob: they are the bounds a calibrated policy is compared with.
KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    "prev.step.max": ("prev_max_margin", _MARGINS),
    "prev.step.rules": ("k_std", (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0)),
    "phase.rule": ("margin", _MARGINS),
    "phase.proactive": ("margin", _MARGINS),
    "phase.headroom": ("headroom_quantile", (0.5, 0.6, 0.7, 0.8, 0.825, 0.85, 0.875, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0)),
    "forecast": ("forecast_miss_cost", _FORECAST_MISS_COSTS),
    "phase.forecast": ("forecast_miss_cost", _FORECAST_MISS_COSTS),
    "vpa": ("vpa_percentile", (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99)),
}

# The quantile levels at which a phase's jumps are kept (phase.headroom): 0, 0.5 %, ..., 100 %.
HEADROOM_LEVELS: tuple[float, ...] = tuple(i / 200 for i in range(201))

# resource -> (usage column, limit column) of the PHASES schema.
RESOURCES: dict[str, tuple[str, str]] = {
    "cpu": ("cpu_usage_cores", "cpu_num_cores"),
    "mem": ("mem_current", "mem_limit"),
}

_VPA_DEFAULTS = VpaParams()
OOM_BUMP_RATIO = _VPA_DEFAULTS.oom_bump_up_ratio  # VPA's --oom-bump-up-ratio (1.2)
OOM_MIN_BUMP_BYTES = _VPA_DEFAULTS.oom_min_bump_up_bytes  # VPA's --oom-min-bump-up-bytes (100 MiB)


def knob_of(policy: str) -> str | None:
    """The :class:`~ai4dl.config.PoliciesConfig` field that is ``policy``'s knob (None: a policy without one)."""
    return KNOBS[policy][0] if policy in KNOBS else None


def vpa_params(params: PoliciesConfig, timed: bool) -> VpaParams:
    """The VPA recommender's parameters of the ``policies`` section; ``timed``: the samples carry timestamps
    (else sample k is at ``k * vpa_step_seconds``)."""
    return VpaParams(
        target_cpu_percentile=float(params.vpa_percentile),
        target_memory_percentile=float(params.vpa_percentile),
        safety_margin_fraction=float(params.vpa_margin),
        cpu_half_life_s=float(params.vpa_cpu_half_life_s),
        memory_half_life_s=float(params.vpa_mem_half_life_s),
        memory_aggregation_interval_s=float(params.vpa_mem_interval_s),
        step_seconds=0.0 if timed else float(params.vpa_step_seconds),
    )


def finite_value(value: Any) -> float:
    """``value`` as a float, NaN for anything missing, non-numeric or infinite."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def phase_codes(phases: Any) -> np.ndarray:
    """Phases as floats (NaN = unlabelled), whatever they came as (ints, floats, None, strings of ints)."""
    arr = np.asarray(phases)
    if arr.dtype.kind == "f":  # already codes (a replay's trace converts once for all its policies and knobs)
        return arr.astype("float64", copy=False).ravel()
    as_objects = pd.Series(np.asarray(phases, dtype=object).ravel(), dtype="object")
    return pd.to_numeric(as_objects, errors="coerce").astype("float64").to_numpy()


def normalise_stats(phase_stats: Mapping | None) -> dict[int, Mapping]:
    """``{phase: entry}`` with integer phase keys (JSON gives strings); keys that are not phases are dropped."""
    out: dict[int, Mapping] = {}
    for key, value in (phase_stats or {}).items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            continue
    return out


# ------------------------------------------------------------------------------------------- what is known


def blocks(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` padded with NaN to whole intervals, shape (intervals, length)."""
    n_int = -(-len(x) // length)
    padded = np.full(n_int * length, np.nan)
    padded[: len(x)] = x
    return padded.reshape(n_int, length)


def interval_summaries(usage: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per interval the max, mean and population std of the known usage (NaN for an interval without any): all a
    reactive rule or an oracle reads of an interval. The live state keeps one interval's values and calls this
    on them, so its numbers are the replay's."""
    b = blocks(np.asarray(usage, dtype=float), length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN intervals
        return np.nanmax(b, axis=1), np.nanmean(b, axis=1), np.nanstd(b, axis=1)


def phase_before(phases: np.ndarray, length: int) -> np.ndarray:
    """For each interval, the last non-null phase of a step before its start (NaN if none)."""
    codes = phase_codes(phases)
    n_int = -(-len(codes) // length)
    ends = np.arange(1, n_int) * length - 1  # the last step before each interval but the first
    seen = np.maximum.accumulate(np.where(np.isnan(codes), -1, np.arange(len(codes))))[ends]  # last labelled step
    out = np.full(n_int, np.nan)
    out[1:] = np.where(seen >= 0, codes[np.maximum(seen, 0)], np.nan)
    return out


def limit_before(lim: np.ndarray, length: int) -> np.ndarray:
    """For each interval, the container's limit at the last step before it (the first interval: at its first
    step): the limit a policy knows when it decides. ``lim`` is per step, already filled."""
    n = len(lim)
    n_int = -(-n // length)
    at = np.maximum(np.arange(n_int) * length - 1, 0)
    return np.asarray(lim, dtype=float)[np.minimum(at, max(n - 1, 0))]


# ------------------------------------------------------------------------------------------------ decisions


def cap(decision: np.ndarray, lim: np.ndarray) -> np.ndarray:
    """Allocations: the decision capped at the limit, the limit where there is no decision, >= 0."""
    alloc = np.where(np.isnan(decision), lim, np.fmin(decision, lim))  # fmin: a NaN limit does not cap
    return np.maximum(alloc, 0.0)


def in_force(decision: float, limit: float) -> float:
    """:func:`cap` of one step (the same numbers): the decision capped at the limit (a NaN limit does not cap),
    the limit without a decision, >= 0; NaN with neither."""
    alloc = limit if decision != decision else (decision if limit != limit else min(decision, limit))
    return max(alloc, 0.0) if alloc == alloc else alloc


def reactive_decisions(policy: str, params: PoliciesConfig, prev_max: np.ndarray, prev_mean: np.ndarray,
                       prev_std: np.ndarray) -> np.ndarray:
    """``prev.step.max`` / ``prev.step.rules`` (and, given the coming interval's summaries, the oracles
    ``current.step.max`` / ``current.step.rules``): NaN where the interval read is unknown."""
    if policy == "prev.step.max":
        return prev_max * (1.0 + float(params.prev_max_margin))
    if policy == "current.step.max":
        return prev_max.copy()
    return prev_mean + float(params.k_std) * prev_std


def _phase_values(stats: Mapping[int, Mapping], phase: int, resource: str, limits: np.ndarray) -> np.ndarray:
    """A phase's statistic for ``resource`` at each of ``limits``: its share of the container's limit or its
    absolute value; NaN where the phase has none (the caller falls back to the limit)."""
    entry = stats.get(phase)
    if not isinstance(entry, Mapping):
        return np.full(len(limits), math.nan)
    if f"{resource}_fraction" in entry:  # a share of this container's limit
        return finite_value(entry[f"{resource}_fraction"]) * limits
    return np.full(len(limits), finite_value(entry.get(resource)))


def phase_decisions(
    current: np.ndarray, limits: np.ndarray, params: PoliciesConfig, stats: Mapping[int, Mapping], resource: str,
    successors: Mapping[int, Mapping[int, float]] | None,
) -> np.ndarray:
    """``phase.rule`` (``successors`` None) or ``phase.proactive``, per interval from its phase before
    (``current``) and its known limit: the max statistic of the phase and of its successors with probability >=
    ``proactive_threshold``, times ``1 + margin``; NaN when any of them has no statistic. One numpy pass per
    phase seen, not per interval: a replay asks for every margin."""
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


def headroom(stats: Mapping[int, Mapping], phase: int, resource: str, quantile: float) -> float:
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


def headroom_decisions(
    prev_max: np.ndarray, current: np.ndarray, limits: np.ndarray, params: PoliciesConfig,
    stats: Mapping[int, Mapping], resource: str,
) -> np.ndarray:
    """``phase.headroom``: per interval, the previous interval's max plus the current phase's learned headroom
    times the known limit."""
    decision = np.full(len(current), np.nan)
    q = float(params.headroom_quantile)
    for p in np.unique(current[~np.isnan(current)]):  # each phase's table read once
        at = (current == p) & ~np.isnan(prev_max)
        decision[at] = prev_max[at] + headroom(stats, int(p), resource, q) * limits[at]
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
    maxima = interval_summaries(np.asarray(usage, dtype=float), length)[0]
    current = phase_before(phases, length)
    starts = np.minimum(np.arange(len(maxima)) * length, max(n - 1, 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        jump = (maxima[1:] - maxima[:-1]) / np.asarray(limit, dtype=float)[starts[1:]]
    keep = ~np.isnan(current[1:]) & np.isfinite(jump)
    return current[1:][keep], jump[keep]


def headroom_tables(phases: np.ndarray, jumps: np.ndarray) -> dict[int, list[float]]:
    """``{phase: quantiles of its jumps at HEADROOM_LEVELS}``: the in-memory counterpart of the Spark
    aggregation :func:`ai4dl.policies.fleet.phase_headroom_stats` (for tests, notebooks and small fleets)."""
    out: dict[int, list[float]] = {}
    phases, jumps = np.asarray(phases, dtype=float), np.asarray(jumps, dtype=float)
    for p in np.unique(phases[~np.isnan(phases)]):
        out[int(p)] = np.quantile(jumps[phases == p], HEADROOM_LEVELS).tolist()
    return out


# --------------------------------------------------------------------------------------------------- OOM kills


def oom_bump(usage: float) -> float:
    """The allocation every policy but ``vpa`` moves to after an OOM kill at ``usage`` bytes (at least; capped
    at the limit): VPA's own OOM bump, ``max(usage + 100 MiB, 1.2 * usage)``.

    >>> oom_bump(1e9), oom_bump(1e8)
    (1200000000.0, 204857600.0)
    """
    return max(usage + OOM_MIN_BUMP_BYTES, usage * OOM_BUMP_RATIO)


def oom_step(decision: float, usage: float, limit: float, prev_over: bool, prev_alloc: float) -> tuple[float, bool, bool]:
    """One memory step under ``decision`` (the interval's decision, raised by earlier kills in it): the
    allocation in force, whether usage is above it, and whether that is a new OOM kill (not the same kill
    as the step before's: over it too, under the same allocation)."""
    alloc = in_force(decision, limit)
    over = usage > alloc  # False for an unknown usage or allocation
    killed = over and not (prev_over and alloc == prev_alloc)
    return alloc, over, killed


@dataclass(frozen=True)
class MemoryOutlook:
    """What :func:`closed_loop` reads of a memory trace whatever the decisions, taken once for the hundred
    decision sequences a knob grid replays over it: usage and limits as Python floats, per step the highest
    usage still to come in its interval, per interval its one limit (:func:`interval_limits`)."""

    usage: list[float]
    limit: list[float]
    ahead: list[float]
    one_limit: list[float]

    @classmethod
    def of(cls, usage: np.ndarray, lim: np.ndarray, length: int) -> "MemoryOutlook":
        return cls(np.asarray(usage, dtype=float).tolist(), np.asarray(lim, dtype=float).tolist(),
                   _usage_ahead(usage, length), interval_limits(lim, length))


def closed_loop(decisions: np.ndarray, usage: np.ndarray, lim: np.ndarray, length: int,
                outlook: MemoryOutlook | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-step memory allocations and OOM kills of a policy (every one but ``vpa``) whose per-interval
    ``decisions`` are raised by :func:`oom_bump` after each kill, to the end of the interval (:func:`oom_step`).
    Intervals without a step above the decision are allocated as decided, at numpy speed; the others step by
    step from their first step above it, until a kill's bump leaves the rest of the interval under its
    allocation (its highest usage to come at or below it, one limit throughout): that rest is allocated at once.
    ``outlook``: the trace's :class:`MemoryOutlook`, when already taken."""
    n = len(usage)
    alloc = cap(np.repeat(decisions, length)[:n], lim)
    with np.errstate(invalid="ignore"):
        over = usage > alloc
    kills = np.zeros(n, dtype=bool)
    if not over.any():
        return alloc, kills
    seen = outlook if outlook is not None else MemoryOutlook.of(usage, lim, length)
    u, lim_l, ahead, one_limit = seen.usage, seen.limit, seen.ahead, seen.one_limit
    a, over_l = alloc.tolist(), over.tolist()
    done = -1  # the last interval stepped through
    for t0 in np.flatnonzero(over).tolist():
        if t0 // length == done:
            continue
        done = t0 // length
        end = min((done + 1) * length, n)
        d = float(decisions[done])
        prev_over = t0 > 0 and over_l[t0 - 1]
        prev_alloc = a[t0 - 1] if t0 > 0 else math.nan
        for t in range(t0, end):  # oom_step and in_force written out: this loop is most of a memory replay
            lt, ut = lim_l[t], u[t]
            at = lt if d != d else (d if lt != lt else min(d, lt))
            if at == at:
                at = max(at, 0.0)
            is_over = ut > at
            killed = is_over and not (prev_over and at == prev_alloc)
            a[t], over_l[t] = at, is_over
            prev_over, prev_alloc = is_over, at
            if killed:
                kills[t] = True
                d = max(at, oom_bump(ut))  # kills are rare: the shared definition costs nothing here
                rest = one_limit[done]
                if t + 1 < end and rest == rest:
                    level = in_force(d, rest)
                    if not ahead[t] > level:  # no step to come is above the bumped allocation
                        a[t + 1:end] = [level] * (end - t - 1)
                        over_l[t + 1:end] = [False] * (end - t - 1)
                        break
    return np.asarray(a), kills


def _usage_ahead(usage: np.ndarray, length: int) -> list[float]:
    """Per step, the highest known usage of the steps after it in its interval (NaN: none)."""
    b = blocks(np.asarray(usage, dtype=float), length)
    after = np.full(b.shape, np.nan)
    after[:, :-1] = np.fmax.accumulate(b[:, :0:-1], axis=1)[:, ::-1]  # fmax: NaN only where all are NaN
    return after.ravel()[: len(usage)].tolist()


def interval_limits(lim: np.ndarray, length: int) -> list[float]:
    """Per interval, its limit when one known value holds for all of its steps, else NaN: with it, whether any
    step of the interval is above an allocation is one comparison with the interval's highest usage."""
    n = len(lim)
    if n == 0:
        return []
    lim_b = blocks(np.asarray(lim, dtype=float), length)
    lim_b[-1, n - (len(lim_b) - 1) * length:] = lim_b[-1, 0]  # the last interval's padding is not a step
    with np.errstate(invalid="ignore"):
        one = np.all(lim_b == lim_b[:, :1], axis=1)  # False with any NaN
    return np.where(one, lim_b[:, 0], np.nan).tolist()


__all__ = [
    "HEADROOM_LEVELS", "KNOBS", "MemoryOutlook", "OOM_BUMP_RATIO", "OOM_MIN_BUMP_BYTES", "RESOURCES", "blocks", "cap", "closed_loop",
    "finite_value", "headroom", "headroom_decisions", "headroom_tables", "in_force", "interval_limits", "interval_summaries", "jumps_of",
    "knob_of", "limit_before", "normalise_stats", "oom_bump", "oom_step", "phase_before", "phase_codes",
    "phase_decisions", "reactive_decisions", "vpa_params",
]

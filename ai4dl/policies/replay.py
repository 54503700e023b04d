"""The policy replay of one container's trace, and what it measures (the AI4DL evaluation).

A container's ``PHASES`` rows are read as one trace (:func:`replay_frame`: by ``step``, missing steps as unknown
rows so intervals stay aligned with the step numbers, limits filled forward then backward), every policy's
allocation is computed for every step by the rules of :mod:`ai4dl.policies.rules` (the module docstring there
has each rule and the OOM-kill semantics), and the replay measures what the container felt:

* ``steps``, ``hours``: steps with known usage and limit, and the container-hours they cover (a sample stands
  for the time until the next one, :func:`step_durations`);
* ``used``, ``allocated``, ``static_allocated``: sums over those steps (core-steps, byte-steps);
* ``met_steps`` (allocation >= usage), ``shortfall_steps``, ``shortfall_total``, ``shortfall_max``;
* memory: ``oom_kills``, kill *events* (the policy reacts to each; a container stuck above an allocation
  nothing can raise is one kill);
* CPU: ``throttled_steps`` and ``throttled_core_seconds`` (missing cores times the step's duration).

Conventions: steps with null usage are skipped by the statistics (nan-aware) and by the metrics; an interval
whose usage is entirely null gets the limit; rows with a null phase are replayed like any other (only the phase
policies' phase detection skips them); usage above the limit cannot be met by any policy (allocations are
capped), so it counts as shortfall even for ``static`` and the oracles.

``vpa``'s clock is the trace's timestamps (``ts``), or step index x ``vpa_step_seconds`` without them. Its
memory is a closed loop: each OOM kill is reported to the recommender (``RecordOOM`` with the allocation in
force as the request, before the step's sample) and its new target is allocated for the rest of the interval.

This module is numpy/pandas only (importable without Spark); :mod:`ai4dl.policies.fleet` runs it over a Spark
DataFrame of the ``PHASES`` schema without collecting the fleet.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ai4dl.config import ORACLES, POLICIES, PoliciesConfig
from ai4dl.errors import InputError
from ai4dl.lake.columns import POLICY_FRONTIER_FIELDS, POLICY_REPLAY_FIELDS
from ai4dl.policies.forecast import FORECASTS, forecast_decisions, forecast_of
from ai4dl.policies.nextphase import normalise_transitions
from ai4dl.policies.rules import (
    KNOBS,
    RESOURCES,
    MemoryOutlook,
    cap,
    closed_loop,
    headroom_decisions,
    in_force,
    interval_limits,
    interval_summaries,
    jumps_of,
    limit_before,
    normalise_stats,
    oom_step,
    phase_before,
    phase_codes,
    phase_decisions,
    reactive_decisions,
    vpa_params,
)
from ai4dl.policies.vpa import VpaRecommender, cpu_targets

# One row per (container, policy, resource): the columns of ai4dl.lake.schema.POLICY_REPLAY; with the knob
# value, one row per (container, policy, knob, resource): ai4dl.lake.schema.POLICY_FRONTIER.
REPLAY_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_REPLAY_FIELDS)
FRONTIER_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_FRONTIER_FIELDS)
_PANDAS_DTYPES = {"bigint": "int64", "double": "float64"}

# PHASES columns a replay needs (activations and the rest are not shipped to the Python workers).
INPUT_COLUMNS = ("pod_id", "service", "ts", "step", "phase", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit")


# ----------------------------------------------------------------------------------------------- the trace


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
class Trace:
    """One container's arrays, prepared once for all the policies and knob values replayed over it."""

    key: dict[str, Any]  # pod_id, service
    phases: np.ndarray | None
    ts_seconds: np.ndarray | None
    durations: np.ndarray
    usage: dict[str, np.ndarray]
    limit: dict[str, np.ndarray]
    _memo: dict[tuple[str, int], Any] = field(default_factory=dict, compare=False, repr=False)

    def summaries(self, resource: str, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`~ai4dl.policies.rules.interval_summaries` of a resource's usage, taken once for the many
        policies and knob values that read them."""
        key = (resource, int(length))
        if key not in self._memo:
            self._memo[key] = interval_summaries(self.usage[resource], int(length))
        return self._memo[key]

    def outlook(self, length: int) -> MemoryOutlook:
        """The memory usage's :class:`~ai4dl.policies.rules.MemoryOutlook`, taken once for every memory replay."""
        key = ("mem.outlook", int(length))
        if key not in self._memo:
            self._memo[key] = MemoryOutlook.of(self.usage["mem"], self.limit["mem"], int(length))
        return self._memo[key]

    @classmethod
    def of(cls, pdf: pd.DataFrame, params: PoliciesConfig) -> "Trace":
        df = replay_frame(pdf)
        service = pdf["service"].dropna().iloc[0] if "service" in pdf and pdf["service"].notna().any() else None
        ts = timestamps_seconds(df)
        return cls(
            key={"pod_id": str(pdf["pod_id"].iloc[0]), "service": service},
            phases=phase_codes(df["phase"].to_numpy(dtype=object)) if "phase" in df else None,
            ts_seconds=ts,
            durations=step_durations(ts, len(df), float(params.vpa_step_seconds)),
            usage={r: pd.to_numeric(df[u], errors="coerce").to_numpy(dtype=float) for r, (u, _) in RESOURCES.items()},
            limit={r: pd.to_numeric(df[c], errors="coerce").ffill().bfill().to_numpy(dtype=float)
                   for r, (_, c) in RESOURCES.items()},
        )


# ----------------------------------------------------------------------------------------------- allocation


def _check_args(n: int, name: str, values: Any, dtype: Any = float) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype).ravel()
    if len(arr) != n:
        raise InputError(f"{name} must have the usage's length {n}, got {len(arr)}")
    return arr


def _as_limit(limit: np.ndarray | float, n: int) -> np.ndarray:
    arr = np.asarray(limit, dtype=float)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if arr.shape != (n,):
        raise InputError(f"limit must be a scalar or have the usage's length {n}, got shape {arr.shape}")
    return arr


def interval_decisions(
    policy: str, usage: np.ndarray, lim: np.ndarray, length: int, params: PoliciesConfig,
    phases: np.ndarray | None, stats: Mapping[int, Mapping], resource: str, successors: Mapping | None,
    forecasters: Mapping | None = None, summaries: tuple[np.ndarray, ...] | None = None,
) -> np.ndarray:
    """Per interval, what ``policy`` (any but ``vpa``) decides before it: NaN where it has no decision (the limit
    is allocated). ``forecasters``: policy -> resource -> :class:`~ai4dl.policies.forecast.Forecaster`;
    ``summaries``: the usage's :func:`~ai4dl.policies.rules.interval_summaries` when already taken."""
    n_int = -(-len(usage) // length)

    def summarised() -> tuple[np.ndarray, ...]:
        return summaries if summaries is not None else interval_summaries(usage, length)

    if policy == "static":
        return np.full(n_int, np.nan)
    if policy in FORECASTS:
        fc = (forecasters or {}).get(policy, {}).get(resource)
        return forecast_decisions(fc, usage, lim, phases, length, float(params.forecast_miss_cost))
    if policy in ORACLES:
        return reactive_decisions(policy, params, *summarised())
    if policy in ("prev.step.max", "prev.step.rules"):
        prev = [np.concatenate([[np.nan], s[:-1]]) for s in summarised()]
        return reactive_decisions(policy, params, *prev)
    if phases is None:
        return np.full(n_int, np.nan)
    current, limits = phase_before(phases, length), limit_before(lim, length)
    if policy == "phase.headroom":
        prev_max = np.concatenate([[np.nan], summarised()[0][:-1]])
        return headroom_decisions(prev_max, current, limits, params, stats, resource)
    return phase_decisions(current, limits, params, stats, resource, successors if policy == "phase.proactive" else None)


def _vpa_samples(usage: np.ndarray, length: int, ts_seconds: np.ndarray | None, params: PoliciesConfig) -> dict[str, Any]:
    """The samples VPA gets, in step order, converted to its clock and units once for every percentile: unknown
    or negative usage and (timed) unknown times are no sample; ``bounds[i]`` is the first sample of interval i."""
    n = len(usage)
    n_int = -(-n // length)
    timed = ts_seconds is not None
    with np.errstate(invalid="ignore"):
        usable = (usage >= 0) if not timed else (usage >= 0) & ~np.isnan(ts_seconds)
    kept = np.flatnonzero(usable)
    times = ts_seconds.tolist() if timed else None
    step_seconds = float(params.vpa_step_seconds)
    at = [VpaRecommender.time_ns(times[k]) if timed else VpaRecommender.time_ns(step=k, step_seconds=step_seconds)
          for k in kept.tolist()]
    return {"kept": kept, "at": at, "bounds": np.searchsorted(kept, np.arange(n_int + 1) * length).tolist(),
            "params": vpa_params(params, timed), "n_int": n_int}


def vpa_cpu_decisions(usage: np.ndarray, length: int, params: PoliciesConfig, ts_seconds: np.ndarray | None,
                      percentiles: Sequence[float]) -> np.ndarray:
    """Per percentile and interval, the real VPA recommender's CPU target given the samples before the interval
    (NaN before its first sample): shape (len(percentiles), intervals). CPU samples do not depend on what was
    allocated, so every interval's and percentile's target comes from one pass
    (:func:`~ai4dl.policies.vpa.cpu_targets`, tested equal to a recommender fed sample by sample)."""
    s = _vpa_samples(usage, length, ts_seconds, params)
    out = np.full((len(percentiles), s["n_int"]), np.nan)
    if s["n_int"] > 1:
        amount = [VpaRecommender.cpu_amount(v) for v in usage[s["kept"]].tolist()]
        out[:, 1:] = cpu_targets(s["at"], amount, s["bounds"][1:s["n_int"]], [float(q) for q in percentiles], s["params"])
    return out


def vpa_memory(usage: np.ndarray, lim: np.ndarray, length: int, params: PoliciesConfig, ts_seconds: np.ndarray | None,
               percentiles: Sequence[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per percentile, the per-step memory allocations and OOM kills of the real VPA recommender in its closed
    loop: before each interval, its target given the samples so far; at each kill, ``RecordOOM`` (the
    allocation in force as the request, before the step's sample) and its new target for the rest of the
    interval (:func:`~ai4dl.policies.rules.oom_step`).

    One recommender per percentile, fed interval by interval. An interval whose samples all stay under the
    allocation in force changes nothing but the histogram's window peaks: it is fed in one call, and when it also
    stays under the current window's peak, only its last sample time is recorded
    (:meth:`~ai4dl.policies.vpa.VpaRecommender.add_quiet_memory_run`); a target is asked again only when the
    histogram changed."""
    n = len(usage)
    s = _vpa_samples(usage, length, ts_seconds, params)
    kept, at, bounds, n_int = s["kept"], s["at"], s["bounds"], s["n_int"]
    amount = [VpaRecommender.memory_amount(v) for v in usage[kept].tolist()]
    quiet = _quiet_runs(usage, kept, bounds, at, amount)
    values, limits, kept_l = usage.tolist(), lim.tolist(), kept.tolist()
    # per interval, its highest known usage and its limit when one known value holds for the whole interval (else
    # NaN): then "no step above the allocation" is one comparison of Python floats, not three numpy calls
    tops, one_limit = interval_summaries(usage, length)[0].tolist(), interval_limits(lim, length)
    out = []
    for q in percentiles:
        rec = VpaRecommender(s["params"])
        alloc, kills = np.empty(n), np.zeros(n, dtype=bool)
        version, target = -1, None
        prev_over, prev_alloc = False, math.nan
        for i in range(n_int):
            d = math.nan
            if i > 0:
                if rec.state_version != version:  # the target is a function of the histogram alone
                    version, target = rec.state_version, rec.target("mem", q)
                if target is not None:
                    d = target
            s0, s1 = i * length, min((i + 1) * length, n)
            if one_limit[i] == one_limit[i]:
                block = last = in_force(d, one_limit[i])
                calm = not tops[i] > last
            else:
                block = cap(np.full(s1 - s0, d), lim[s0:s1])
                last = float(block[-1])
                with np.errstate(invalid="ignore"):
                    calm = not (usage[s0:s1] > block).any()
            start, end = bounds[i], bounds[i + 1]
            if calm:
                alloc[s0:s1] = block
                if start < end:
                    first_ns, last_ns, peak, forward = quiet[i]
                    if not (forward and rec.add_quiet_memory_run(first_ns, last_ns, peak)):
                        rec.add_memory_run(at, amount, start, end)
                prev_over, prev_alloc = False, last
                continue
            j = start
            for t in range(s0, s1):
                a, over, killed = oom_step(d, values[t], limits[t], prev_over, prev_alloc)
                alloc[t] = a
                sample = j < end and kept_l[j] == t
                if killed:
                    kills[t] = True
                    if sample:
                        rec.record_oom_at(at[j], a)
                if sample:
                    rec.add_memory_run(at, amount, j, j + 1)
                    j += 1
                    if killed:
                        version, target = rec.state_version, rec.target("mem", q)
                        if target is not None:
                            d = target
                prev_over, prev_alloc = over, a
        out.append((alloc, kills))
    return out


def _quiet_runs(usage: np.ndarray, kept: np.ndarray, bounds: list[int], at: list[int], amount: list[int]) -> list[tuple]:
    """Per interval, what the memory loop's short path needs: (first and last sample time; highest amount;
    whether the sample times never go backwards). Meaningless for an interval without samples."""
    n_int = len(bounds) - 1
    out: list[tuple] = [(0, 0, 0, False)] * n_int
    starts, ends = np.asarray(bounds[:-1]), np.asarray(bounds[1:])
    filled = np.flatnonzero(starts < ends)
    if not len(filled):
        return out
    first = starts[filled]  # each filled interval's samples run from its start to the next filled one's
    backwards = [b < a for a, b in zip(at, at[1:])]  # Python ints: Go's clock does not fit an int64
    reversals = np.concatenate([[0], np.cumsum(backwards, dtype=np.int64)])  # time going backwards among the first j samples
    forward = (reversals[ends[filled] - 1] == reversals[first]).tolist()
    peak_amount = np.maximum.reduceat(np.asarray(amount, dtype=np.int64), first).tolist()
    for c, i in enumerate(filled.tolist()):
        out[i] = (at[bounds[i]], at[bounds[i + 1] - 1], peak_amount[c], forward[c])
    return out


def allocations(
    policy: str, trace: Trace, resource: str, params: PoliciesConfig, phase_stats: Mapping | None = None,
    transitions: Any = None, forecasters: Mapping | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step allocation of ``policy`` for ``resource`` over a prepared trace, and the OOM kills (memory; all
    False for CPU)."""
    usage, lim = trace.usage[resource], trace.limit[resource]
    length = int(params.interval_steps)
    n = len(usage)
    if policy == "vpa":
        if resource == "mem":
            return vpa_memory(usage, lim, length, params, trace.ts_seconds, [params.vpa_percentile])[0]
        decided = vpa_cpu_decisions(usage, length, params, trace.ts_seconds, [params.vpa_percentile])[0]
    else:
        successors = normalise_transitions(transitions) if policy == "phase.proactive" else None
        decided = interval_decisions(policy, usage, lim, length, params, trace.phases, normalise_stats(phase_stats),
                                     resource, successors, forecasters, trace.summaries(resource, length))
    return held(decided, usage, lim, length, resource, trace.outlook(length) if resource == "mem" else None)


def held(decided: np.ndarray, usage: np.ndarray, lim: np.ndarray, length: int, resource: str,
         outlook: MemoryOutlook | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-step allocations and OOM kills of per-interval decisions held for their interval: capped at the
    limit; for memory raised after each OOM kill (:func:`~ai4dl.policies.rules.closed_loop`, ``outlook`` the
    memory trace's :class:`~ai4dl.policies.rules.MemoryOutlook` when already taken)."""
    n = len(usage)
    if resource == "mem":
        return closed_loop(decided, usage, lim, length, outlook)
    return cap(np.repeat(decided, length)[:n], lim), np.zeros(n, dtype=bool)


def allocate(
    policy: str,
    usage: np.ndarray,
    limit: np.ndarray | float,
    params: PoliciesConfig,
    phases: np.ndarray | None = None,
    phase_stats: dict | None = None,
    resource: str = "cpu",
    ts_seconds: np.ndarray | None = None,
    transitions: Any = None,
    forecasters: Mapping | None = None,
) -> np.ndarray:
    """Per-step allocation of ``policy`` over one container's trace (``usage`` in step order, NaN = unknown;
    ``limit`` a scalar or per step; ``phases`` per step, None/NaN = unlabelled; ``phase_stats`` and
    ``transitions`` as the phase policies read them; ``ts_seconds`` ``vpa``'s clock and the step durations).
    Memory allocations include each policy's reaction to OOM kills (:mod:`ai4dl.policies.rules`)."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
    if resource not in RESOURCES:
        raise InputError(f"unknown resource '{resource}' (known: {', '.join(RESOURCES)})")
    u = np.asarray(usage, dtype=float).ravel()
    n = len(u)
    if n == 0:
        return np.zeros(0)
    ts = None if ts_seconds is None else _check_args(n, "ts_seconds", ts_seconds)
    trace = Trace(
        key={}, phases=None if phases is None else _check_args(n, "phases", phase_codes(phases)), ts_seconds=ts,
        durations=step_durations(ts, n, float(params.vpa_step_seconds)), usage={resource: u},
        limit={resource: _as_limit(limit, n)},
    )
    return allocations(policy, trace, resource, params, phase_stats, transitions, forecasters)[0]


# ------------------------------------------------------------------------------------------------- metrics


def _metrics(usage: np.ndarray, alloc: np.ndarray, limit: np.ndarray, resource: str, durations: np.ndarray,
             kills: np.ndarray) -> dict[str, Any]:
    ok = ~np.isnan(usage) & ~np.isnan(limit) & ~np.isnan(alloc)
    u, a, lim = usage[ok], alloc[ok], limit[ok]
    short = np.maximum(u - a, 0.0)
    met = int(np.count_nonzero(a >= u))
    steps = int(ok.sum())
    cpu = resource == "cpu"
    return {
        "steps": steps,
        "hours": float(durations[ok].sum()) / 3600.0,
        "used": float(u.sum()),
        "allocated": float(a.sum()),
        "static_allocated": float(lim.sum()),
        "met_steps": met,
        "shortfall_steps": steps - met,
        "shortfall_total": float(short.sum()),
        "shortfall_max": float(short.max()) if steps else 0.0,
        "oom_kills": 0 if cpu else int(np.count_nonzero(kills[ok])),
        "throttled_steps": steps - met if cpu else 0,
        "throttled_core_seconds": float((short * durations[ok]).sum()) if cpu else 0.0,
    }


def _typed(df: pd.DataFrame, declared: tuple[tuple[str, str, bool], ...]) -> pd.DataFrame:
    for name, sql_type, _ in declared:
        if sql_type in _PANDAS_DTYPES:
            df[name] = df[name].astype(_PANDAS_DTYPES[sql_type])
    return df


def _frame(rows: list[dict], declared: tuple[tuple[str, str, bool], ...]) -> pd.DataFrame:
    columns = [name for name, _, _ in declared]
    if not rows:
        return _typed(pd.DataFrame({c: pd.Series(dtype="object") for c in columns}), declared)
    return _typed(pd.DataFrame(rows, columns=columns), declared)


def _rows(trace: Trace, policy: str, params: PoliciesConfig, phase_stats: Mapping | None, transitions: Any,
          given: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None, forecasters: Mapping | None = None) -> list[dict]:
    """One row per resource; ``given`` has a resource's allocations and kills already computed."""
    rows = []
    for resource in RESOURCES:
        if given is not None and resource in given:
            alloc, kills = given[resource]
        else:
            alloc, kills = allocations(policy, trace, resource, params, phase_stats, transitions, forecasters)
        rows.append({**trace.key, "policy": policy, "resource": resource,
                     **_metrics(trace.usage[resource], alloc, trace.limit[resource], resource, trace.durations, kills)})
    return rows


# ------------------------------------------------------------------------------------------------ replays


def replay_container(
    pdf: pd.DataFrame, params: PoliciesConfig | None = None, phase_stats: Mapping | None = None, transitions: Any = None,
    forecasters: Mapping | None = None,
) -> pd.DataFrame:
    """Replay one container's ``PHASES`` rows under every policy: one row per (policy, resource), columns
    :data:`REPLAY_COLUMNS`."""
    params = params or PoliciesConfig()
    if pdf is None or len(pdf) == 0:
        return _frame([], POLICY_REPLAY_FIELDS)
    trace = Trace.of(pdf, params)
    rows = [row for policy in POLICIES
            for row in _rows(trace, policy, params, phase_stats, transitions, forecasters=forecasters)]
    return _frame(rows, POLICY_REPLAY_FIELDS)


def knob_grids(knobs: Mapping[str, Sequence[float]] | None = None) -> dict[str, tuple[float, ...]]:
    """Each policy of :data:`~ai4dl.policies.rules.KNOBS` with its grid: the default one, or the values
    ``knobs`` gives for it."""
    grids = {policy: grid for policy, (_, grid) in KNOBS.items()}
    for policy, values in (knobs or {}).items():
        if policy not in KNOBS:
            raise InputError(f"policy '{policy}' has no knob (policies with one: {', '.join(KNOBS)})")
        grid = tuple(float(v) for v in values)
        if not grid:
            raise InputError(f"the knob grid of '{policy}' is empty")
        grids[policy] = grid
    return grids


@functools.lru_cache(maxsize=1024)
def _tuned(params: PoliciesConfig, knob: str, value: float) -> PoliciesConfig:
    """``params`` with one knob set: built (and checked) once per knob value in a process, not once per container
    and value, since the same few hundred are asked for every container of a replay."""
    return dataclasses.replace(params, **{knob: value})


def replay_container_grid(
    pdf: pd.DataFrame,
    params: PoliciesConfig | None = None,
    phase_stats: Mapping | None = None,
    transitions: Any = None,
    knobs: Mapping[str, Sequence[float]] | None = None,
    policies: Sequence[str] | None = None,
    forecasters: Mapping | None = None,
) -> pd.DataFrame:
    """Replay one container under every policy (or those of ``policies``) and every value of its knob: one row
    per (policy, knob value, resource), columns :data:`FRONTIER_COLUMNS` (``knob`` NaN for the policies without
    one, replayed once). ``knobs`` maps a policy to the values to try instead of its default grid; every other
    parameter is ``params``'. Summed over containers, these rows are what
    :func:`~ai4dl.policies.calibration.choose_knob` calibrates on."""
    params = params or PoliciesConfig()
    grids = knob_grids(knobs)
    unknown = [p for p in (policies or ()) if p not in POLICIES]
    if unknown:
        raise InputError(f"unknown policies {unknown} (known: {', '.join(POLICIES)})")
    if pdf is None or len(pdf) == 0:
        return _frame([], POLICY_FRONTIER_FIELDS)
    trace = Trace.of(pdf, params)
    length = int(params.interval_steps)
    rows = []
    for policy in POLICIES if policies is None else [p for p in POLICIES if p in policies]:
        if policy not in KNOBS:
            rows += [{**r, "knob": math.nan} for r in _rows(trace, policy, params, phase_stats, transitions,
                                                               forecasters=forecasters)]
            continue
        name = KNOBS[policy][0]
        shared: dict[str, list] = {}
        if policy in FORECASTS:  # one forecast per resource, then every margin from it
            for resource in RESOURCES:
                fc = (forecasters or {}).get(policy, {}).get(resource)
                usage, lim = trace.usage[resource], trace.limit[resource]
                fcast = forecast_of(fc, usage, lim, trace.phases, length)
                n_int = -(-len(usage) // length)
                outlook = trace.outlook(length) if resource == "mem" else None
                shared[resource] = [held(np.full(n_int, np.nan) if fcast is None else fcast.decisions(value), usage, lim,
                                         length, resource, outlook) for value in grids[policy]]
        if policy == "vpa" and len(trace.usage["cpu"]):  # every percentile from one conversion of the samples
            grid = grids[policy]
            usage, lim = trace.usage["cpu"], trace.limit["cpu"]
            shared["cpu"] = [(cap(np.repeat(d, length)[:len(usage)], lim), np.zeros(len(usage), dtype=bool))
                             for d in vpa_cpu_decisions(usage, length, params, trace.ts_seconds, grid)]
            shared["mem"] = vpa_memory(trace.usage["mem"], trace.limit["mem"], length, params, trace.ts_seconds, grid)
        for j, value in enumerate(grids[policy]):
            tuned = _tuned(params, name, value)
            given = {resource: results[j] for resource, results in shared.items()} or None
            rows += [{**r, "knob": value} for r in _rows(trace, policy, tuned, phase_stats, transitions, given, forecasters)]
    return _frame(rows, POLICY_FRONTIER_FIELDS)


JUMP_COLUMNS: tuple[str, ...] = ("phase", "resource", "jump")


def container_jumps(pdf: pd.DataFrame, params: PoliciesConfig | None = None) -> pd.DataFrame:
    """:func:`~ai4dl.policies.rules.jumps_of` for both resources of one container's ``PHASES`` rows, read as the
    replay reads them: columns :data:`JUMP_COLUMNS`, one row per (interval, resource). The fleet's jumps come
    from Spark's aggregations (:func:`ai4dl.policies.fleet.phase_jumps`), tested equal to this."""
    params = params or PoliciesConfig()
    empty = pd.DataFrame({"phase": pd.Series(dtype="int64"), "resource": pd.Series(dtype="object"),
                          "jump": pd.Series(dtype="float64")})
    if pdf is None or len(pdf) == 0:
        return empty
    trace = Trace.of(pdf, params)
    if trace.phases is None:
        return empty
    parts = []
    for resource in RESOURCES:
        ph, jump = jumps_of(trace.usage[resource], trace.limit[resource], trace.phases, int(params.interval_steps))
        parts.append(pd.DataFrame({"phase": ph.astype("int64"), "resource": resource, "jump": jump}))
    return pd.concat(parts, ignore_index=True)[list(JUMP_COLUMNS)]


__all__ = [
    "FRONTIER_COLUMNS", "INPUT_COLUMNS", "JUMP_COLUMNS", "REPLAY_COLUMNS", "Trace", "allocate", "allocations",
    "container_jumps", "held", "interval_decisions", "knob_grids", "replay_container", "replay_container_grid",
    "replay_frame", "step_durations", "timestamps_seconds", "vpa_cpu_decisions", "vpa_memory",
]

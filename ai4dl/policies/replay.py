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
    the max of the previous interval's usage; the first interval gets the limit.
``prev.step.rules`` (reactive)
    ``mean + k_std * std`` of the previous interval; the first interval gets the limit.
``phase.rule``
    the phase of the container is the last non-null phase of a step *before* the interval starts (normally the
    last step of the previous interval); the allocation is that phase's statistic from ``phase_stats`` (e.g. its
    p95 over training containers) times ``1 + margin``. No phase seen yet, or a phase without a (finite)
    statistic: the limit.
``vpa`` (Kubernetes VPA-style recommender)
    the ``vpa_percentile`` weighted percentile of *all* past usage samples of the container, times
    ``1 + margin``. A sample ``s`` steps old at the interval start weighs ``2 ** (-s / vpa_half_life_steps)``
    (exponential decay with that half-life). The histogram is exact: a weighted quantile over the past samples
    themselves, not VPA's fixed exponential buckets, so the recommendation is not quantised to bucket edges.
    The percentile is the smallest past value whose cumulative weight reaches ``percentile * total weight``.
    The first interval (no history) gets the limit.

Conventions, shared by all policies:

* Every allocation is capped at the container's limit (a recommender never allocates above the static request,
  which is what the container was admitted with) and is ``>= 0``.
* Steps with null usage are skipped by the statistics (nan-aware mean/std/max/quantile) and by the metrics. An
  interval whose relevant usage is entirely null gets the limit (nothing to base a decision on).
* Null limits are filled forward then backward within the container (the limit is a per-container constant in
  practice); a step whose limit is still unknown is skipped by the metrics like a null-usage step.
* Rows with a null phase are replayed like any other (their usage is known); only ``phase.rule``'s phase
  detection skips them.
* Usage above the limit cannot be met by any policy (allocations are capped), so it counts as shortfall even
  for ``static`` and the oracles.

This module is numpy/pandas only (importable without Spark); :mod:`ai4dl.policies.fleet` runs
:func:`replay_container` over a Spark DataFrame of the ``PHASES`` schema without collecting the fleet.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
import pandas as pd
from ai4dl.lake.columns import POLICY_REPLAY_FIELDS

POLICIES: tuple[str, ...] = (
    "static",
    "current.step.max",
    "current.step.rules",
    "prev.step.max",
    "prev.step.rules",
    "phase.rule",
    "vpa",
)

# resource -> (usage column, limit column) of the PHASES schema.
RESOURCES: dict[str, tuple[str, str]] = {
    "cpu": ("cpu_usage_cores", "cpu_num_cores"),
    "mem": ("mem_current", "mem_limit"),
}

# One row per (container, policy, resource): the columns of ai4dl.lake.schema.POLICY_REPLAY.
REPLAY_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_REPLAY_FIELDS)
_PANDAS_DTYPES = {"bigint": "int64", "double": "float64"}

# PHASES columns a replay needs (activations and the rest are not shipped to the Python workers).
INPUT_COLUMNS = ("pod_id", "service", "step", "phase", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit")


@dataclass(frozen=True)
class PolicyParams:
    interval_steps: int = 10
    k_std: float = 2.0
    margin: float = 0.15
    vpa_percentile: float = 0.9
    vpa_half_life_steps: float = 120

    def __post_init__(self) -> None:
        if int(self.interval_steps) < 1:
            raise ValueError(f"interval_steps must be >= 1, got {self.interval_steps}")
        if not 0.0 <= float(self.vpa_percentile) <= 1.0:
            raise ValueError(f"vpa_percentile must be in [0, 1], got {self.vpa_percentile}")
        if float(self.vpa_half_life_steps) <= 0:
            raise ValueError(f"vpa_half_life_steps must be > 0, got {self.vpa_half_life_steps}")

    @classmethod
    def from_config(cls, section: Any) -> "PolicyParams":
        """From the ``policies`` config section (:class:`ai4dl.config.PoliciesConfig` or a mapping of it);
        the section's keys that are not replay parameters (the phase statistic) are ignored."""
        values = section if isinstance(section, Mapping) else {f.name: getattr(section, f.name) for f in fields(section)}
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


# --------------------------------------------------------------------------------------------------- core


def _as_limit(limit: np.ndarray | float, n: int) -> np.ndarray:
    arr = np.asarray(limit, dtype=float)
    if arr.ndim == 0:
        return np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"limit must be a scalar or have the usage's length {n}, got shape {arr.shape}")
    return arr


def _blocks(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` padded with NaN to whole intervals, shape (intervals, length)."""
    n_int = -(-len(x) // length)
    padded = np.full(n_int * length, np.nan)
    padded[: len(x)] = x
    return padded.reshape(n_int, length)


def _interval_stat(usage: np.ndarray, length: int, stat: str, k: float) -> np.ndarray:
    """Per-interval max or mean + k*std (population), NaN for an interval without usage."""
    b = _blocks(usage, length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN intervals
        if stat == "max":
            return np.nanmax(b, axis=1)
        return np.nanmean(b, axis=1) + k * np.nanstd(b, axis=1)


def _weighted_quantile_past(usage: np.ndarray, length: int, q: float, half_life: float) -> np.ndarray:
    """For each interval start ``t0 = i*length``, the q weighted quantile of ``usage[:t0]`` (NaN without history).

    The samples are sorted by value once; each interval then costs one masked cumulative sum (O(n)), so a
    2,000-step container with 10-step intervals is 200 vector operations.
    """
    n = len(usage)
    n_int = -(-n // length)
    out = np.full(n_int, np.nan)
    steps = np.flatnonzero(~np.isnan(usage))
    if steps.size == 0:
        return out
    order = np.argsort(usage[steps], kind="stable")
    values = usage[steps][order]
    at = steps[order].astype(float)  # step of each sorted sample
    for i in range(1, n_int):
        t0 = i * length
        past = at < t0
        if not past.any():
            continue
        newest = at[past].max()  # weights relative to the newest past sample: no underflow of the total
        w = np.where(past, np.exp2(-np.maximum(newest - at, 0.0) / half_life), 0.0)
        cum = np.cumsum(w)
        total = cum[-1]
        idx = int(np.searchsorted(cum, q * total * (1 - 1e-12), side="left"))
        idx = min(idx, len(values) - 1)
        # skip zero-weight (future) samples the search may land on
        while idx < len(values) - 1 and not past[idx]:
            idx += 1
        out[i] = values[idx]
    return out


def _phase_before(phases: np.ndarray, length: int) -> np.ndarray:
    """For each interval, the last non-null phase of a step before its start (NaN if none)."""
    n = len(phases)
    n_int = -(-n // length)
    p = pd.to_numeric(pd.Series(phases, dtype="object"), errors="coerce").astype("float64").to_numpy()
    last = pd.Series(p).ffill().to_numpy()  # last non-null phase up to and including each step
    out = np.full(n_int, np.nan)
    for i in range(1, n_int):
        out[i] = last[i * length - 1]
    return out


def normalise_stats(phase_stats: Mapping | None) -> dict[int, Mapping]:
    out: dict[int, Mapping] = {}
    for key, value in (phase_stats or {}).items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            continue
    return out


def finite_value(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def allocate(
    policy: str,
    usage: np.ndarray,
    limit: np.ndarray | float,
    params: PolicyParams,
    phases: np.ndarray | None = None,
    phase_stats: dict | None = None,
    resource: str = "cpu",
) -> np.ndarray:
    """Per-step allocation of ``policy`` over one container's trace (``usage`` in step order, NaN = unknown).

    ``limit`` is a scalar or a per-step array; every allocation is ``min(decision, limit)`` and ``>= 0``, and
    an interval without a decision (first interval of a reactive policy, no phase, no history) gets the limit.
    ``phases`` (per step, None/NaN = unlabelled) and ``phase_stats`` (``{phase: {"cpu": v, "mem": v}}``) are
    used by ``phase.rule`` only; ``resource`` picks the statistic from ``phase_stats``.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy '{policy}' (known: {', '.join(POLICIES)})")
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
    elif policy in ("prev.step.max", "prev.step.rules"):
        stat = _interval_stat(u, length, "max" if policy == "prev.step.max" else "rules", float(params.k_std))
        decision = np.concatenate([[np.nan], stat[:-1]])
    elif policy == "phase.rule":
        decision = np.full(n_int, np.nan)
        if phases is not None:
            ph = np.asarray(phases, dtype=object).ravel()
            if len(ph) != n:
                raise ValueError(f"phases must have the usage's length {n}, got {len(ph)}")
            stats = normalise_stats(phase_stats)
            current = _phase_before(ph, length)
            for i, p in enumerate(current):
                if np.isnan(p) or int(p) not in stats:
                    continue
                entry = stats[int(p)]
                if not isinstance(entry, Mapping):
                    continue
                if f"{resource}_fraction" in entry:  # a share of this container's limit
                    value = finite_value(entry[f"{resource}_fraction"]) * lim[min(i * length, n - 1)]
                else:
                    value = finite_value(entry.get(resource))
                decision[i] = value * (1.0 + float(params.margin))
    else:  # vpa
        q = _weighted_quantile_past(u, length, float(params.vpa_percentile), float(params.vpa_half_life_steps))
        decision = q * (1.0 + float(params.margin))

    per_step = np.repeat(decision, length)[:n]
    alloc = np.where(np.isnan(per_step), lim, np.fmin(per_step, lim))  # fmin: a NaN limit does not cap
    return np.maximum(alloc, 0.0)


def _metrics(usage: np.ndarray, alloc: np.ndarray, limit: np.ndarray) -> dict[str, Any]:
    ok = ~np.isnan(usage) & ~np.isnan(limit) & ~np.isnan(alloc)
    u, a, lim = usage[ok], alloc[ok], limit[ok]
    short = np.maximum(u - a, 0.0)
    met = int(np.count_nonzero(a >= u))
    steps = int(ok.sum())
    return {
        "steps": steps,
        "used": float(u.sum()),
        "allocated": float(a.sum()),
        "static_allocated": float(lim.sum()),
        "met_steps": met,
        "shortfall_steps": steps - met,
        "shortfall_total": float(short.sum()),
        "shortfall_max": float(short.max()) if steps else 0.0,
    }


def _empty_replay() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype="object") for c in REPLAY_COLUMNS})
    return _typed(df)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for name, sql_type, _ in POLICY_REPLAY_FIELDS:
        if sql_type in _PANDAS_DTYPES:
            df[name] = df[name].astype(_PANDAS_DTYPES[sql_type])
    return df


def replay_container(
    pdf: pd.DataFrame, params: PolicyParams | None = None, phase_stats: Mapping | None = None
) -> pd.DataFrame:
    """Replay one container's ``PHASES`` rows under every policy: one row per (policy, resource).

    Rows are sorted by ``step``; missing step numbers between the first and the last are replayed as unknown
    usage (so intervals stay aligned with the step numbers). Duplicate steps keep their first row.
    """
    params = params or PolicyParams()
    if pdf is None or len(pdf) == 0:
        return _empty_replay()
    df = pdf.sort_values("step", kind="stable").drop_duplicates("step", keep="first")
    steps = df["step"].astype("int64").to_numpy()
    span = np.arange(steps[0], steps[-1] + 1)
    df = df.set_index(pd.Index(steps)).reindex(span)
    pod_id = str(pdf["pod_id"].iloc[0])
    service = pdf["service"].dropna().iloc[0] if "service" in pdf and pdf["service"].notna().any() else None
    phases = df["phase"].to_numpy(dtype=object) if "phase" in df else None

    rows = []
    for resource, (usage_col, limit_col) in RESOURCES.items():
        usage = pd.to_numeric(df[usage_col], errors="coerce").to_numpy(dtype=float)
        limit = pd.to_numeric(df[limit_col], errors="coerce").ffill().bfill().to_numpy(dtype=float)
        for policy in POLICIES:
            alloc = allocate(policy, usage, limit, params, phases, phase_stats, resource)
            rows.append(
                {"pod_id": pod_id, "service": service, "policy": policy, "resource": resource,
                 **_metrics(usage, alloc, limit)}
            )
    return _typed(pd.DataFrame(rows, columns=list(REPLAY_COLUMNS)))


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

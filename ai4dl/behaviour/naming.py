"""Phases described in words and numbers, from the usage they cover (pure numpy/pandas).

A phase number means nothing to an operator; "high variable CPU, memory heavy and rising" does. The words are
derived from a phase's *profile*: over the steps it labels, the mean CPU and memory use as a fraction of the
limit, how much CPU varies, and how memory moves from one step to the next (the median change: a phase that
loads its memory at once and then holds it is flat, one that keeps growing is rising). Levels are relative to
the fleet the model was trained on (tertiles of all its steps), so a fleet that never exceeds 10 % of its CPU
limit still gets low, moderate and high phases; trends are relative to how much memory moves in that fleet.

The profile is computed where the model is trained (:meth:`ai4dl.method.training.PhaseEstimator.fit`, on the
CRBM's sampled windows) and stored with the model (``info["phase_names"]``, ``info["phase_descriptions"]``,
``info["phase_profile"]``); every place that shows a phase uses :func:`phase_name`, which falls back to
"phase k" for models without names (the imported original model, older versions).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

# A phase's CPU is "variable" when its own coefficient of variation exceeds this.
VARIABLE_CPU_CV = 0.35
# Memory "rises"/"falls" when its median step-to-step change exceeds this fraction of the fleet's typical
# step-to-step change (its standard deviation, winsorised at the 5th/95th percentiles).
TREND_OF_TYPICAL_CHANGE = 0.15
# A memory "drop" or "jump" is a step-to-step change beyond this many times the fleet's typical change. A phase
# where at least SWING_SHARE of the steps drop and as many jump swings; one that drops that often but climbs
# gradually in between (its median change rising) is a sawtooth (a training loop whose memory climbs through an
# epoch and falls back). A phase entered by one jump (memory loaded at once, then held) does neither.
SWING_OF_TYPICAL_CHANGE = 4.0
SWING_SHARE = 0.02
PROFILE_COLUMNS = ("phase", "steps", "share", "cpu", "cpu_sd", "mem", "mem_change", "mem_drops", "mem_jumps")
# What tells two phases of the same words apart, in the order tried: (profile column, label, format).
_DISTINGUISHERS = (("cpu", "CPU", "pct"), ("mem", "memory", "pct"), ("cpu_sd", "CPU sd", "pct"),
                   ("mem_change", "memory change", "points"), ("share", "share of steps", "pct"))


def utilisation(raw: np.ndarray, features: Sequence[str]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """CPU and memory use as fractions of their limits, from whichever raw features a model has: the
    percentages (``cpu_usage_pct``, ``mem_usage_pct``), else usage / limit, else the derived shares
    (``cpu_frac``, ``cpu_frac_min10``, ``mem_frac``). None where it has neither."""
    col = {f: raw[:, i] for i, f in enumerate(features)}

    def ratio(use: str, limit: str) -> np.ndarray | None:
        if use in col and limit in col:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = col[use] / col[limit]
            return np.where(np.isfinite(r), r, np.nan)
        return None

    shares = [c for c in ("cpu_frac", "cpu_frac_min10") if c in col]  # derived shares (ai4dl.method.features)
    if "cpu_usage_pct" in col:
        cpu = col["cpu_usage_pct"] / 100.0
    else:
        cpu = ratio("cpu_usage_cores", "cpu_num_cores")
        cpu = cpu if cpu is not None or not shares else col[shares[0]]
    if "mem_frac" in col and "mem_usage_pct" not in col:
        mem = col["mem_frac"]
    elif "mem_usage_pct" in col:
        mem = col["mem_usage_pct"] / 100.0
    else:
        mem = ratio("mem_working_set", "mem_limit")
        mem = mem if mem is not None else ratio("mem_current", "mem_limit")
    return cpu, mem


def phase_profile(phases: np.ndarray, cpu: np.ndarray | None, mem: np.ndarray | None,
                  mem_before: np.ndarray | None = None, typical_change: float | None = None) -> pd.DataFrame:
    """Per phase: steps, share, mean CPU and its standard deviation, mean memory, its median change per step
    (``mem - mem_before``; NaN without the previous step), and the shares of its steps whose change drops or jumps
    by more than :data:`SWING_OF_TYPICAL_CHANGE` times ``typical_change`` (NaN without it). Columns
    :data:`PROFILE_COLUMNS`."""
    phases = np.asarray(phases, dtype=float)
    n = int(np.isfinite(phases).sum())
    rows = []
    change = None if mem is None or mem_before is None else mem - mem_before
    for p in sorted({int(v) for v in phases[np.isfinite(phases)]}):
        m = phases == p

        def mean(a: np.ndarray | None) -> float:
            return float(np.nanmean(a[m])) if a is not None and np.isfinite(a[m]).any() else np.nan

        cpu_sd = float(np.nanstd(cpu[m])) if cpu is not None and np.isfinite(cpu[m]).any() else np.nan
        # the median: the jump into a phase (memory loaded at once, then held) is not a trend of the phase
        known = change is not None and np.isfinite(change[m]).any()
        median_change = float(np.nanmedian(change[m])) if known else np.nan
        drops = jumps = np.nan
        if known and typical_change:
            c = change[m][np.isfinite(change[m])]
            drops = float(np.mean(c < -SWING_OF_TYPICAL_CHANGE * typical_change))
            jumps = float(np.mean(c > SWING_OF_TYPICAL_CHANGE * typical_change))
        rows.append((p, int(m.sum()), m.sum() / n, mean(cpu), cpu_sd, mean(mem), median_change, drops, jumps))
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def describe(profile: pd.DataFrame, cpu_cuts: tuple[float, float] | None, mem_cuts: tuple[float, float] | None,
             typical_change: float | None) -> dict[int, tuple[str, str]]:
    """``{phase: (name, description)}``. ``*_cuts``: the fleet's tertiles of per-step CPU / memory use (None:
    no such feature); ``typical_change``: the fleet's standard deviation of memory change per step.

    Names are unique and say what differs: phases whose words read the same get, in brackets, the figure that
    tells them apart (their CPU, memory, CPU spread, memory trend or share of steps, the first that does)."""
    out: dict[int, tuple[str, str]] = {}
    for r in profile.itertuples():
        words, numbers = [], []
        if cpu_cuts is not None and np.isfinite(r.cpu):
            level = _level(r.cpu, cpu_cuts, ("low", "moderate", "high"))
            cv = r.cpu_sd / r.cpu if r.cpu > 0 else 0.0
            words.append(f"{level} {'variable' if cv > VARIABLE_CPU_CV else 'steady'} CPU")
            numbers.append(f"CPU {_pct(r.cpu)} of limit (sd {_pct(r.cpu_sd)})")
        if mem_cuts is not None and np.isfinite(r.mem):
            level = _level(r.mem, mem_cuts, ("light", "moderate", "heavy"))
            trend = "flat"
            if typical_change and np.isfinite(r.mem_change):
                if r.mem_change > TREND_OF_TYPICAL_CHANGE * typical_change:
                    trend = "rising"
                elif r.mem_change < -TREND_OF_TYPICAL_CHANGE * typical_change:
                    trend = "falling"
            drops, jumps = getattr(r, "mem_drops", np.nan), getattr(r, "mem_jumps", np.nan)
            if np.isfinite(drops) and drops >= SWING_SHARE:
                if np.isfinite(jumps) and jumps >= SWING_SHARE:
                    trend = "swinging"  # large steps both ways: noise or spikes, not a saw
                elif trend == "rising":
                    trend = "rising in a sawtooth"  # gradual climbs, sudden drops
            words.append(f"memory {level} and {trend}")
            numbers.append(f"memory {_pct(r.mem)} of limit"
                           + (f", {r.mem_change * 100:+.2f} points per step" if np.isfinite(r.mem_change) else ""))
        name = ", ".join(words) or f"phase {r.phase}"
        numbers.append(f"{_pct(r.share)} of steps")
        out[int(r.phase)] = (name, f"{name}: " + "; ".join(numbers))
    return _distinct(out, profile)


def _distinct(named: dict[int, tuple[str, str]], profile: pd.DataFrame) -> dict[int, tuple[str, str]]:
    """Phases sharing a name get the figure that tells them apart appended: the first of
    :data:`_DISTINGUISHERS` whose formatted values differ within the group (several when one does not suffice);
    a group no figure separates (identical profiles) falls back to the phase numbers."""
    by_phase = {int(r.phase): r for r in profile.itertuples()}
    groups: dict[str, list[int]] = {}
    for p, (n, _) in named.items():
        groups.setdefault(n, []).append(p)
    out = dict(named)
    for name, members in groups.items():
        if len(members) < 2:
            continue
        tags: dict[int, list[str]] = {p: [] for p in members}
        for column, label, kind in _DISTINGUISHERS:
            values = {p: getattr(by_phase[p], column, np.nan) for p in members}
            shown = {p: _figure_of(v, kind) for p, v in values.items()}
            if len(set(shown.values())) < 2:
                continue
            for p in members:
                tags[p].append(f"{label} {shown[p]}")
            if len({tuple(t) for t in tags.values()}) == len(members):
                break
        if len({tuple(t) for t in tags.values()}) < len(members):
            tags = {p: tags[p] + [f"phase {p}"] for p in members}
        for p in members:
            unique = f"{name} ({', '.join(tags[p])})"
            out[p] = (unique, unique + named[p][1][len(name):])
    return out


def _figure_of(value: float, kind: str) -> str:
    if not np.isfinite(value):
        return "n/a"
    return f"{value * 100:.0f}%" if kind == "pct" else f"{value * 100:+.2f} points per step"


def name_phases(phases: np.ndarray, raw: np.ndarray, raw_before: np.ndarray | None,
                features: Sequence[str]) -> dict[str, Any]:
    """What a model stores about its phases, from labelled steps: ``raw`` their raw features (the model's
    feature order), ``raw_before`` the same of each step's previous step (or None)."""
    cpu, mem = utilisation(raw, features)
    mem_before = utilisation(raw_before, features)[1] if raw_before is not None else None
    labelled = np.isfinite(np.asarray(phases, dtype=float))
    change = None if mem is None or mem_before is None else (mem - mem_before)[labelled]
    typical = None
    if change is not None and np.isfinite(change).any():
        # winsorised at the 5th/95th percentiles: the jumps between phases would otherwise set the scale
        lo, hi = np.nanquantile(change, [0.05, 0.95])
        typical = float(np.nanstd(np.clip(change, lo, hi)))
    profile = phase_profile(phases, cpu, mem, mem_before, typical)
    named = describe(profile, _tertiles(cpu, labelled), _tertiles(mem, labelled), typical)
    return {
        "phase_names": {str(p): n for p, (n, _) in named.items()},
        "phase_descriptions": {str(p): d for p, (_, d) in named.items()},
        "phase_profile": {c: [None if isinstance(v, float) and not np.isfinite(v) else v for v in profile[c].tolist()]
                          for c in PROFILE_COLUMNS},
    }


def phase_name(info: Mapping[str, Any] | None, phase: Any) -> str | None:
    """The name a model gives ``phase`` ("phase k" when it has none); None for no phase."""
    if phase is None or (isinstance(phase, float) and not np.isfinite(phase)):
        return None
    return names_of(info).get(int(phase), f"phase {int(phase)}")


def names_of(info: Mapping[str, Any] | None) -> dict[int, str]:
    """A model's phase names by phase id (its ``info`` stores them by string key, as JSON must); empty when it
    names none."""
    return {int(k): str(v) for k, v in ((info or {}).get("phase_names") or {}).items()}


def _tertiles(values: np.ndarray | None, labelled: np.ndarray) -> tuple[float, float] | None:
    if values is None:
        return None
    v = values[labelled]
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    lo, hi = np.quantile(v, [1 / 3, 2 / 3])
    return float(lo), float(hi)


def _level(value: float, cuts: tuple[float, float], words: tuple[str, str, str]) -> str:
    # inclusive: a phase sitting on the fleet's floor (many steps share that value) is low, not moderate
    return words[0] if value <= cuts[0] else words[2] if value >= cuts[1] else words[1]


def _pct(v: float) -> str:
    return f"{v * 100:.0f}%" if np.isfinite(v) else "n/a"


__all__ = ["describe", "name_phases", "names_of", "phase_name", "phase_profile", "utilisation"]

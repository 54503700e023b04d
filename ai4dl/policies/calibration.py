"""Policies compared at one service level: each policy's knob chosen on training containers, scored held out.

A policy's savings mean nothing without the fulfilment they cost: a reactive rule that allocates less because
it misses demand 30 % of the time is not cheaper, it is worse. So every policy family is tuned by its one knob
(:data:`~ai4dl.policies.replay.KNOBS`) to the smallest allocation that still meets the target fulfilment on
the *training* containers (:func:`~ai4dl.policies.replay.choose_knob`), and that knob is then scored on the
*held-out* containers, which it never saw. The held-out replay over the whole knob range is the frontier
(savings vs fulfilment), kept as a gold table and drawn in the report.

Pure pandas: the inputs are per-(policy, resource, knob) totals, a few hundred rows summed in Spark
(:func:`ai4dl.policies.fleet.frontier_totals`).

>>> import pandas as pd
>>> def totals(rows):
...     cols = ["policy", "resource", "knob", "containers", "steps", "met_steps", "allocated", "static_allocated",
...             "oom_kills", "throttled_steps", "throttled_core_seconds"]
...     return pd.DataFrame(rows, columns=cols)
>>> train = totals([("static", "mem", float("nan"), 2, 100, 100, 1000.0, 1000.0, 0, 0, 0.0),
...                 ("vpa", "mem", 0.5, 2, 100, 80, 400.0, 1000.0, 20, 0, 0.0),
...                 ("vpa", "mem", 0.9, 2, 100, 96, 600.0, 1000.0, 4, 0, 0.0)])
>>> held = totals([("static", "mem", float("nan"), 4, 200, 200, 2000.0, 2000.0, 0, 0, 0.0),
...                ("vpa", "mem", 0.5, 4, 200, 150, 900.0, 2000.0, 50, 0, 0.0),
...                ("vpa", "mem", 0.9, 4, 200, 190, 1200.0, 2000.0, 10, 0, 0.0)])
>>> out = calibrate(train, held, 0.95)
>>> vpa = out.set_index("policy").loc["vpa"]
>>> float(vpa.knob), bool(vpa.reached), float(vpa.fulfilment), float(vpa.savings_vs_static), float(vpa.oom_kills_per_100)
(0.9, True, 0.95, 0.4, 250.0)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ai4dl.errors import InputError
from ai4dl.lake.columns import POLICY_CALIBRATION_FIELDS
from ai4dl.policies.replay import POLICIES, ServiceLevel, choose_knob

CALIBRATION_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_CALIBRATION_FIELDS)
_TOTALS = ("containers", "steps", "met_steps", "allocated", "static_allocated", "oom_kills", "throttled_steps",
           "throttled_core_seconds")


def _same_knob(a: pd.Series, value: float) -> pd.Series:
    return a.isna() if value is None or (isinstance(value, float) and math.isnan(value)) else a == value


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else math.nan


def calibrate(train_totals: pd.DataFrame, held_totals: pd.DataFrame, target_fulfilment: float | ServiceLevel) -> pd.DataFrame:
    """One row per (policy, resource) with :data:`CALIBRATION_COLUMNS`: the knob chosen on ``train_totals``
    for ``target_fulfilment`` (one share for both resources, or a :class:`~ai4dl.policies.replay.ServiceLevel`),
    and the held-out totals at that knob with savings against static, against the calibrated
    ``prev.step.rules`` and against the calibrated ``vpa`` of the same resource."""
    missing = [c for c in ("policy", "resource", "knob", *_TOTALS) if c not in held_totals.columns]
    if missing:
        raise InputError(f"held-out totals lack column(s) {missing}")
    level = ServiceLevel.of(target_fulfilment)
    chosen = choose_knob(train_totals, level)
    rows = []
    for c in chosen.itertuples(index=False):
        held = held_totals[(held_totals["policy"] == c.policy) & (held_totals["resource"] == c.resource)
                           & _same_knob(held_totals["knob"], c.knob)]
        if held.empty:  # a policy replayed on training containers only: nothing to score
            continue
        h = held[list(_TOTALS)].sum()
        rows.append({
            "policy": c.policy, "resource": c.resource, "knob_name": c.knob_name,
            "knob": None if c.knob is None or (isinstance(c.knob, float) and math.isnan(c.knob)) else float(c.knob),
            "target_fulfilment": level.fulfilment(c.resource),
            "oom_budget_per_100": float(level.oom_kills_per_100) if level.by_oom(c.resource) else math.nan,
            "train_fulfilment": float(c.fulfilment),
            "reached": bool(c.reached), "containers": int(h["containers"]), "steps": int(h["steps"]),
            "allocated": float(h["allocated"]), "static_allocated": float(h["static_allocated"]),
            "fulfilment": _ratio(h["met_steps"], h["steps"]),
            "savings_vs_static": 1.0 - _ratio(h["allocated"], h["static_allocated"]),
            "oom_kills": int(h["oom_kills"]), "oom_kills_per_100": 100.0 * _ratio(h["oom_kills"], h["containers"]),
            "throttled_steps": int(h["throttled_steps"]), "throttled_core_seconds": float(h["throttled_core_seconds"]),
        })
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=list(CALIBRATION_COLUMNS))
    for baseline, column in (("prev.step.rules", "savings_vs_prev_rules"), ("vpa", "savings_vs_vpa")):
        base = out[out["policy"] == baseline].set_index("resource")["allocated"]
        out[column] = [1.0 - _ratio(a, base.get(r, np.nan)) if r in base else math.nan
                       for a, r in zip(out["allocated"], out["resource"])]
    order = {p: i for i, p in enumerate(POLICIES)}
    out = out.sort_values(["resource", "policy"], key=lambda s: s.map(order) if s.name == "policy" else s)
    return out[list(CALIBRATION_COLUMNS)].reset_index(drop=True)


def format_calibration(table: pd.DataFrame) -> str:
    """The comparison people ask for first: per resource, savings vs static and vs VPA at the target."""
    if table.empty:
        return "calibration: nothing to compare"
    targets = []
    for resource, rows in table.groupby("resource", sort=True):
        budget, share = rows["oom_budget_per_100"].iloc[0], rows["target_fulfilment"].iloc[0]
        targets.append(f"{resource} <= {budget:g} OOM kills per 100 containers" if pd.notna(budget) else f"{resource} {share:.0%} of steps met")
    lines = [f"policies at {', '.join(targets)} (knob chosen on training containers, scored on held-out ones)"]
    head = f"{'resource':<8} {'policy':<20} {'knob':>18} {'fulfilment':>10} {'vs static':>9} {'vs VPA':>8} {'vs prev.rules':>13} {'OOM/100':>8} {'throttled s':>11}"
    lines.append(head)
    lines.append("-" * len(head))
    for r in table.itertuples(index=False):
        knob = "-" if r.knob_name is None or pd.isna(r.knob) else f"{r.knob_name}={r.knob:g}"
        missed = "" if r.reached else " (target not reached in training)"
        pct = lambda v: "-" if v is None or pd.isna(v) else f"{v:.1%}"  # noqa: E731
        lines.append(
            f"{r.resource:<8} {r.policy:<20} {knob:>18} {pct(r.fulfilment):>10} {pct(r.savings_vs_static):>9} "
            f"{pct(r.savings_vs_vpa):>8} {pct(r.savings_vs_prev_rules):>13} {r.oom_kills_per_100:>8.1f} "
            f"{r.throttled_core_seconds:>11.0f}{missed}"
        )
    return "\n".join(lines)


__all__ = ["CALIBRATION_COLUMNS", "calibrate", "format_calibration"]

"""The policy comparison as people read it: one fixed-width table, per resource and policy, at the service level
the policy model was calibrated for, with units in the headers and the deployed policy marked."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def _pct(v: Any) -> str:
    return "-" if v is None or pd.isna(v) else f"{100.0 * float(v):.1f}%"


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or pd.isna(v) else format(float(v), fmt)


def format_comparison(table: pd.DataFrame, header: str | None = None) -> str:
    """:func:`~ai4dl.policies.calibration.calibrate`'s rows (the gold ``policy_calibration`` table) as text:
    each policy at its calibrated knob on the held-out containers. ``*`` marks the policy the stream deploys for
    a resource; a policy whose knob could not reach the service level on the training containers says so."""
    if table.empty:
        return "policies: nothing to compare"
    lines = []
    if header:
        lines.append(header)
    targets = []
    for resource, rows in table.groupby("resource", sort=True):
        budget, share = rows["oom_budget_per_100h"].iloc[0], rows["target_fulfilment"].iloc[0]
        targets.append(f"{resource} <= {budget:g} OOM kills per 100 container-hours" if pd.notna(budget)
                       else f"{resource} {share:.0%} of steps met")
    held = table.iloc[0]
    lines.append(f"service level: {', '.join(targets)}; knobs chosen on training containers, scored on "
                 f"{int(held['containers'])} held-out containers ({_num(held['hours'], ',.0f')} container-hours); "
                 "* = deployed by `ai4dl stream`")
    head = (f"  {'resource':<8} {'policy':<19} {'knob':>19} {'steps met':>9} {'saved vs static':>15} {'vs VPA':>7} "
            f"{'vs prev.rules':>13} {'OOM kills/100 h':>15} {'throttled core-s':>16}")
    lines.append(head)
    lines.append("  " + "-" * (len(head) - 2))
    for r in table.itertuples(index=False):
        knob = "-" if r.knob_name is None or pd.isna(r.knob) else f"{r.knob_name}={r.knob:g}"
        note = "" if r.reached else "  (service level not reached in training)"
        oom = _num(r.oom_kills_per_100h, ".1f") if r.resource == "mem" else "-"
        throttled = _num(r.throttled_core_seconds, ",.0f") if r.resource == "cpu" else "-"
        mark = "*" if getattr(r, "deployed", False) else " "
        lines.append(
            f"{mark} {r.resource:<8} {r.policy:<19} {knob:>19} {_pct(r.fulfilment):>9} {_pct(r.savings_vs_static):>15} "
            f"{_pct(r.savings_vs_vpa):>7} {_pct(r.savings_vs_prev_rules):>13} {oom:>15} {throttled:>16}{note}"
        )
    return "\n".join(lines)


def format_next_phase(scores: dict[str, float]) -> str:
    """One line: how well the training transitions (each service's beside the fleet's) predict held-out
    containers' next phase."""
    if not scores or not scores.get("boundaries"):
        return "next phase: no held-out phase changes to predict"
    f1 = scores.get("f1", math.nan)
    return (f"next phase predicted at {scores['correct']} of {scores['boundaries']} held-out run ends (precision "
            f"{scores['precision']:.2f}, recall {scores['recall']:.2f}, F1 {f1:.2f})")


__all__ = ["format_comparison", "format_next_phase"]

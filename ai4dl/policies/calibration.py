"""Policies compared at one service level: each policy's knob chosen on training containers, scored held out.

A policy's savings mean nothing without the service they cost: a reactive rule that allocates less because it
misses demand 30 % of the time is not cheaper, it is worse. So every policy family is tuned by its one knob
(:data:`~ai4dl.policies.rules.KNOBS`) to the smallest allocation that still reaches the service level on the
*training* containers (:func:`choose_knob`), and that knob is then scored on the *held-out* containers, which it
never saw (:func:`calibrate`). The service level (:class:`ServiceLevel`) is, for CPU, the share of steps whose
usage is met; for memory an OOM budget in kills per 100 container-hours (or a share of steps met).

Pure pandas: the inputs are per-(policy, resource, knob) totals, a few hundred rows summed in Spark
(:func:`ai4dl.policies.fleet.frontier_totals`).

>>> import pandas as pd
>>> def totals(rows):
...     cols = ["policy", "resource", "knob", "containers", "hours", "steps", "met_steps", "allocated",
...             "static_allocated", "oom_kills", "throttled_steps", "throttled_core_seconds"]
...     return pd.DataFrame(rows, columns=cols)
>>> train = totals([("static", "mem", float("nan"), 2, 50.0, 100, 100, 1000.0, 1000.0, 0, 0, 0.0),
...                 ("vpa", "mem", 0.5, 2, 50.0, 100, 80, 400.0, 1000.0, 20, 0, 0.0),
...                 ("vpa", "mem", 0.9, 2, 50.0, 100, 96, 600.0, 1000.0, 4, 0, 0.0)])
>>> held = totals([("static", "mem", float("nan"), 4, 100.0, 200, 200, 2000.0, 2000.0, 0, 0, 0.0),
...                ("vpa", "mem", 0.5, 4, 100.0, 200, 150, 900.0, 2000.0, 50, 0, 0.0),
...                ("vpa", "mem", 0.9, 4, 100.0, 200, 190, 1200.0, 2000.0, 10, 0, 0.0)])
>>> out = calibrate(train, held, ServiceLevel(cpu_fulfilment=0.95, oom_kills_per_100h=10.0))
>>> vpa = out.set_index("policy").loc["vpa"]
>>> float(vpa.knob), bool(vpa.reached), float(vpa.savings_vs_static), float(vpa.oom_kills_per_100h)
(0.9, True, 0.4, 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ai4dl.config import LIVE_POLICIES, POLICIES, PoliciesConfig
from ai4dl.errors import InputError
from ai4dl.lake.columns import POLICY_CALIBRATION_FIELDS, POLICY_REPLAY_FIELDS
from ai4dl.policies.rules import KNOBS, finite_value

CALIBRATION_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_CALIBRATION_FIELDS)
# The replay's numeric columns that add up over containers (shortfall_max is a max, not a sum).
ADDITIVE: tuple[str, ...] = tuple(name for name, sql_type, _ in POLICY_REPLAY_FIELDS
                                  if sql_type in ("bigint", "double") and name != "shortfall_max")
_TOTALS = ("containers", "hours", "steps", "met_steps", "allocated", "static_allocated", "oom_kills",
           "throttled_steps", "throttled_core_seconds")


@dataclass(frozen=True)
class ServiceLevel:
    """The service level policies are compared at, per resource. CPU: the share of steps that get at least their
    usage. Memory: an OOM budget, at most ``oom_kills_per_100h`` kills per 100 container-hours (how a platform
    team states memory: an OOM kill is an event that costs a restart), or, with ``mem_fulfilment``, a share of
    steps met like CPU's.

    >>> ServiceLevel(0.95, oom_kills_per_100h=10).describe("mem"), ServiceLevel.of(0.9).describe("mem")
    ('<= 10 OOM kills per 100 container-hours', '90% of steps met')
    """

    cpu_fulfilment: float
    mem_fulfilment: float | None = None
    oom_kills_per_100h: float | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_fulfilment", "mem_fulfilment"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= finite_value(value) <= 1.0:
                raise InputError(f"ServiceLevel.{name} must be in [0, 1], got {value!r}")
        if self.oom_kills_per_100h is not None and not finite_value(self.oom_kills_per_100h) >= 0.0:
            raise InputError(f"ServiceLevel.oom_kills_per_100h must be >= 0, got {self.oom_kills_per_100h!r}")
        if (self.mem_fulfilment is None) == (self.oom_kills_per_100h is None):
            raise InputError("ServiceLevel: memory is held to one of mem_fulfilment or oom_kills_per_100h, exactly one")

    @classmethod
    def of(cls, target: "float | ServiceLevel") -> "ServiceLevel":
        """A service level as given, or one share of steps met for both resources."""
        if isinstance(target, ServiceLevel):
            return target
        share = finite_value(target)
        if not 0.0 <= share <= 1.0:
            raise InputError(f"a service level must be a share of steps in [0, 1], got {target!r}")
        return cls(cpu_fulfilment=share, mem_fulfilment=share)

    @classmethod
    def from_config(cls, params: PoliciesConfig) -> "ServiceLevel":
        """From the ``policies`` section: CPU ``target_fulfilment_cpu`` (else ``target_fulfilment``); memory
        ``target_fulfilment_mem`` when set, else the ``oom_budget_per_100h`` OOM budget, else
        ``target_fulfilment``."""
        cpu = params.target_fulfilment if params.target_fulfilment_cpu is None else params.target_fulfilment_cpu
        if params.target_fulfilment_mem is not None:
            return cls(float(cpu), mem_fulfilment=float(params.target_fulfilment_mem))
        if params.oom_budget_per_100h is not None:
            return cls(float(cpu), oom_kills_per_100h=float(params.oom_budget_per_100h))
        return cls(float(cpu), mem_fulfilment=float(params.target_fulfilment))

    def by_oom(self, resource: str) -> bool:
        return resource == "mem" and self.oom_kills_per_100h is not None

    def fulfilment(self, resource: str) -> float:
        """The share of steps to meet for ``resource`` (NaN when memory is held to an OOM budget instead)."""
        if self.by_oom(resource):
            return math.nan
        return float(self.cpu_fulfilment if resource == "cpu" else self.mem_fulfilment)

    def describe(self, resource: str) -> str:
        if self.by_oom(resource):
            return f"<= {self.oom_kills_per_100h:g} OOM kills per 100 container-hours"
        return f"{self.fulfilment(resource):.0%} of steps met"

    def as_dict(self) -> dict[str, float | None]:
        return {"cpu_fulfilment": self.cpu_fulfilment, "mem_fulfilment": self.mem_fulfilment,
                "oom_kills_per_100h": self.oom_kills_per_100h}


def _per_100h(kills: Any, hours: Any) -> np.ndarray:
    kills, hours = np.asarray(kills, dtype=float), np.asarray(hours, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(hours > 0, 100.0 * kills / hours, np.nan)


def choose_knob(frame: pd.DataFrame, level: "float | ServiceLevel") -> pd.DataFrame:
    """Per (policy, resource), the knob value with the smallest ``allocated`` that reaches ``level`` (a
    :class:`ServiceLevel`, or one share of steps met for both resources): each policy at the matched service
    level, at its lowest cost.

    ``frame`` holds rows of (``policy``, ``resource``, ``knob``) with at least ``steps``, ``met_steps`` and
    ``allocated``, and for an OOM budget ``oom_kills`` and ``hours`` (e.g. replay rows of many containers, or
    totals already summed per knob in Spark); rows of the same (policy, resource, knob) are summed first, as are
    the other additive replay columns present. A knob-less policy (``knob`` NaN) has one candidate. When no
    value reaches the level, the most generous one is returned: the highest fulfilment, or for an OOM budget the
    fewest kills per hour (ties: the smaller allocation), flagged ``reached = False``. Ties in allocation go to
    the smaller knob.

    Returns one row per (policy, resource), ordered by resource then :data:`~ai4dl.config.POLICIES`:
    ``policy``, ``resource``, ``knob_name`` (None without a knob), ``knob``, the summed columns, ``fulfilment``,
    ``oom_kills_per_100h`` (when the frame has kills and hours) and ``reached``.
    """
    level = ServiceLevel.of(level)
    missing = [c for c in ("policy", "resource", "knob", "steps", "met_steps", "allocated") if c not in frame.columns]
    if level.oom_kills_per_100h is not None:
        missing += [c for c in ("oom_kills", "hours") if c not in frame.columns]
    if missing:
        raise InputError(f"choose_knob: the frame lacks column(s) {missing} (have: {list(frame.columns)})")
    keys = ["policy", "resource", "knob"]
    summed = [c for c in (*ADDITIVE, "containers") if c in frame.columns]
    totals = frame.groupby(keys, dropna=False, sort=True)[summed].sum().reset_index()
    steps = totals["steps"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        totals["fulfilment"] = np.where(steps > 0, totals["met_steps"].to_numpy(dtype=float) / steps, np.nan)
    if "oom_kills" in totals.columns and "hours" in totals.columns:
        totals["oom_kills_per_100h"] = _per_100h(totals["oom_kills"], totals["hours"])
    wanted = totals["resource"].map(level.fulfilment).to_numpy(dtype=float)
    totals["reached"] = totals["fulfilment"].to_numpy() >= wanted  # NaN (no steps) never reaches
    if level.oom_kills_per_100h is not None:
        by_oom = (totals["resource"] == "mem").to_numpy()
        within = totals["oom_kills_per_100h"].to_numpy(dtype=float) <= float(level.oom_kills_per_100h)
        totals["reached"] = np.where(by_oom, within, totals["reached"].to_numpy())

    picks = []
    for (_, resource), group in totals.groupby(["policy", "resource"], sort=False):
        if group["reached"].any():
            best = group[group["reached"]].sort_values(["allocated", "knob"], kind="stable").iloc[0]
        elif level.by_oom(resource):
            best = group.sort_values(["oom_kills_per_100h", "allocated", "knob"], na_position="last", kind="stable").iloc[0]
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


def best_live(chosen: pd.DataFrame, level: "float | ServiceLevel") -> dict[str, str]:
    """Per resource, the policy that can run live (neither an oracle nor ``static``) with the smallest
    allocation (as a share of static's) among those that reached ``level`` in :func:`choose_knob`'s rows ``chosen``; without any, the one
    closest to it (the fewest OOM kills per hour for a memory budget, else the highest fulfilment). What the
    stream deploys by default."""
    level = ServiceLevel.of(level)
    out = {}
    for resource, rows in chosen.groupby("resource", sort=True):
        rows = rows[rows["policy"].isin([p for p in LIVE_POLICIES if p != "static"])]
        if rows.empty:
            continue
        # Policies may be calibrated on different training containers (a forecaster's margin on those its trees
        # never saw): compare allocations as shares of the same containers' static allocation.
        rows = rows.assign(_share=rows["allocated"] / rows["static_allocated"].where(rows["static_allocated"] > 0))
        if rows["reached"].any():
            best = rows[rows["reached"]].sort_values(["_share", "policy"], kind="stable").iloc[0]
        elif level.by_oom(str(resource)):
            best = rows.sort_values(["oom_kills_per_100h", "_share"], kind="stable").iloc[0]
        else:
            best = rows.sort_values(["fulfilment", "_share"], ascending=[False, True], kind="stable").iloc[0]
        out[str(resource)] = str(best["policy"])
    return out


def _same_knob(a: pd.Series, value: float) -> pd.Series:
    return a.isna() if value is None or (isinstance(value, float) and math.isnan(value)) else a == value


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else math.nan


def calibrate(train_totals: pd.DataFrame, held_totals: pd.DataFrame, level: float | ServiceLevel,
              deployed: Mapping[str, str] | None = None, chosen: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (policy, resource) with :data:`CALIBRATION_COLUMNS`: the knob chosen on ``train_totals`` for
    ``level`` (or given: ``chosen``, :func:`choose_knob`'s rows), and the held-out totals at that knob with
    savings against static, against the calibrated ``prev.step.rules`` and against the calibrated ``vpa`` of
    the same resource; ``deployed`` (resource -> policy) marks what the stream deploys."""
    missing = [c for c in ("policy", "resource", "knob", *_TOTALS) if c not in held_totals.columns]
    if missing:
        raise InputError(f"held-out totals lack column(s) {missing}")
    level = ServiceLevel.of(level)
    chosen = choose_knob(train_totals, level) if chosen is None else chosen
    deployed = dict(deployed or {})
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
            "oom_budget_per_100h": float(level.oom_kills_per_100h) if level.by_oom(c.resource) else math.nan,
            "train_fulfilment": float(c.fulfilment),
            "train_oom_kills_per_100h": float(getattr(c, "oom_kills_per_100h", math.nan)) if c.resource == "mem" else math.nan,
            "reached": bool(c.reached), "deployed": deployed.get(c.resource) == c.policy,
            "containers": int(h["containers"]), "hours": float(h["hours"]), "steps": int(h["steps"]),
            "allocated": float(h["allocated"]), "static_allocated": float(h["static_allocated"]),
            "fulfilment": _ratio(h["met_steps"], h["steps"]),
            "savings_vs_static": 1.0 - _ratio(h["allocated"], h["static_allocated"]),
            "oom_kills": int(h["oom_kills"]), "oom_kills_per_100h": float(_per_100h(h["oom_kills"], h["hours"])),
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


__all__ = ["ADDITIVE", "CALIBRATION_COLUMNS", "ServiceLevel", "best_live", "calibrate", "choose_knob"]

"""What knowing the phase is worth: a value-of-information ladder between today's best baseline and clairvoyance.

Savings alone do not say what phases buy. The ladder puts, per resource and service level, every number on one
scale: the share of the gap closed between the best of today's baselines (``prev.step.rules``, ``vpa``) and
the clairvoyant ``current.step.max`` (every step of the coming interval met at its exact peak),
``(S - S_baseline) / (S_clairvoyant - S_baseline)``. Its rungs are one policy family, the forecaster
(:mod:`ai4dl.policies.forecast`), given more and more knowledge:

``a``  ``forecast``: the recent intervals only, no phase;
``b``  ``phase.forecast`` with the learned phases (what the product deploys);
``c``  ``phase.forecast`` with the true current behaviour as the phase (a fleet with ground truth);
``d``  ``phase.forecast`` with the true behaviour of the *coming* interval (an upper bound on what any phase
       model could add: perfect phases, known one interval early);
``d'`` on data without ground truth, the learned phase of the coming interval, known in hindsight.

``b - a`` is what the learned phases add; ``d - a`` what perfect phases would. A rung is fitted on the training
containers and scored on the held-out ones, exactly as the policy model is (its knob chosen on training
containers for the level). Where ``d - a`` is small the fleet's phases carry nothing a forecaster of recent
usage does not already know, and the product says so (:func:`verdict`).

Pure pandas on calibration totals (:func:`ai4dl.policies.fleet.frontier_totals` rows), plus :func:`rung_phases`,
the Spark column swaps that make rungs c, d and d'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import pandas as pd

from ai4dl.lake.columns import POLICY_LADDER_FIELDS
from ai4dl.policies.calibration import ServiceLevel, calibrate

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

BASELINES = ("prev.step.rules", "vpa")
CLAIRVOYANT = "current.step.max"
RUNGS: dict[str, tuple[str, str]] = {  # rung -> (policy, what it knows)
    "a": ("forecast", "recent usage, no phase"),
    "b": ("phase.forecast", "+ learned phase"),
    "c": ("phase.forecast", "+ true current behaviour"),
    "d": ("phase.forecast", "+ true behaviour of the coming interval"),
    "d'": ("phase.forecast", "+ learned phase of the coming interval (hindsight)"),
}
LADDER_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in POLICY_LADDER_FIELDS)


@dataclass(frozen=True)
class Level:
    """One service level of the ladder for one resource: a share of steps met, or (memory) an OOM budget."""

    resource: str
    fulfilment: float | None = None
    oom_budget_per_100h: float | None = None

    def service_level(self) -> ServiceLevel:
        if self.oom_budget_per_100h is not None:
            return ServiceLevel(0.0, oom_kills_per_100h=float(self.oom_budget_per_100h))
        return ServiceLevel(float(self.fulfilment), mem_fulfilment=float(self.fulfilment))

    @property
    def label(self) -> str:
        return self.service_level().describe(self.resource)


def default_levels(oom_budget_per_100h: float | None = 10.0) -> tuple[Level, ...]:
    """CPU at 95 % and 99 % of steps met; memory at 95 % and 99 % of steps met and at the OOM budget."""
    levels = [Level("cpu", 0.95), Level("cpu", 0.99), Level("mem", 0.95), Level("mem", 0.99)]
    if oom_budget_per_100h is not None:
        levels.append(Level("mem", oom_budget_per_100h=float(oom_budget_per_100h)))
    return tuple(levels)


def _scored(train: pd.DataFrame, held: pd.DataFrame, level: Level) -> pd.DataFrame:
    table = calibrate(train, held, level.service_level())
    return table[table["resource"] == level.resource].set_index("policy")


def gap_closed(savings: float, baseline: float, clairvoyant: float) -> float:
    """``(S - S_baseline) / (S_clairvoyant - S_baseline)``; NaN without a gap.

    >>> gap_closed(0.375, 0.25, 0.5)
    0.5
    """
    gap = clairvoyant - baseline
    return (savings - baseline) / gap if gap > 1e-12 else math.nan


def ladder(totals: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]], levels: tuple[Level, ...]) -> pd.DataFrame:
    """The ladder's rows (:data:`LADDER_COLUMNS`) from each rung's (training, held-out) calibration totals
    (``totals["b"]`` holds every policy: it gives the baselines, the clairvoyant and the best live policy). Per
    level: the clairvoyant, the best baseline, every rung's policy, and ``best``: the live policy that saves
    most among those that reached the level on the training containers."""
    from ai4dl.config import LIVE_POLICIES

    rows = []
    for level in levels:
        base_table = _scored(*totals["b"], level)
        clair = float(base_table.loc[CLAIRVOYANT, "savings_vs_static"])
        candidates = base_table.loc[[p for p in BASELINES if p in base_table.index]]
        reached = candidates[candidates["reached"]]
        base_row = (reached if len(reached) else candidates).sort_values("savings_vs_static").iloc[-1]
        baseline = float(base_row["savings_vs_static"]) if len(reached) else 0.0  # none reaches: static's 0

        def row(rung: str, policy: str, knows: str, r: pd.Series | None) -> dict:
            s = float(r["savings_vs_static"]) if r is not None else math.nan
            return {"resource": level.resource, "level": level.label, "rung": rung, "policy": policy, "knows": knows,
                    "savings": s, "reached": bool(r["reached"]) if r is not None else False,
                    "fulfilment": float(r["fulfilment"]) if r is not None else math.nan,
                    "oom_kills_per_100h": float(r["oom_kills_per_100h"]) if r is not None and level.resource == "mem" else math.nan,
                    "gap_closed": gap_closed(s, baseline, clair)}

        rows.append(row("clairvoyant", CLAIRVOYANT, "the coming interval's peak", base_table.loc[CLAIRVOYANT]))
        rows.append(row("baseline", str(base_row.name), "best of prev.step.rules, vpa" + ("" if len(reached) else
                                                                                        " (none reached: static)"),
                        base_row if len(reached) else None) | ({} if len(reached) else {"savings": 0.0, "gap_closed": 0.0}))
        live = base_table.loc[[p for p in LIVE_POLICIES if p in base_table.index and p != "static"]]
        ok = live[live["reached"]]
        if len(ok):
            best = ok.sort_values("savings_vs_static").iloc[-1]
            rows.append(row("best", str(best.name), "the live policy saving most at the level", best))
        for rung, (policy, knows) in RUNGS.items():
            if rung not in totals:
                continue
            table = base_table if rung == "b" else _scored(*totals[rung], level)
            rows.append(row(rung, policy, knows, table.loc[policy] if policy in table.index else None))
    return pd.DataFrame(rows, columns=list(LADDER_COLUMNS))


def phase_worth(table: pd.DataFrame) -> pd.DataFrame:
    """Per (resource, level): what the learned phases add (``b - a``), what perfect phases would (``d - a``, or
    ``d' - a`` without ground truth), in savings points and gap closed, and the share of the oracle's
    addition the learned phases reach (``(b - a) / (d - a)``)."""
    out = []
    for (resource, level), part in table.groupby(["resource", "level"], sort=False):
        by = part.set_index("rung")
        get = lambda r, c="savings": float(by.loc[r, c]) if r in by.index else math.nan  # noqa: E731
        oracle = "d" if "d" in by.index else ("d'" if "d'" in by.index else None)
        added = get("b") - get("a")
        perfect = get(oracle) - get("a") if oracle else math.nan
        out.append({"resource": resource, "level": level, "learned_adds": added, "perfect_adds": perfect,
                    "oracle_rung": oracle, "learned_share_of_perfect": added / perfect if perfect > 1e-3 else math.nan,
                    "learned_gap_closed_adds": get("b", "gap_closed") - get("a", "gap_closed"),
                    "perfect_gap_closed_adds": get(oracle, "gap_closed") - get("a", "gap_closed")})
    return pd.DataFrame(out)


def verdict(worth: pd.DataFrame, threshold: float = 0.01) -> list[str]:
    """One line per (resource, level): whether phases are worth anything on this fleet, in plain words. Below
    ``threshold`` (a share of the static allocation) an addition is "nothing"."""
    lines = []
    for w in worth.itertuples(index=False):
        oracle = "perfect phases" if w.oracle_rung == "d" else "the learned phase known in hindsight"
        if math.isnan(w.learned_adds):  # a forecaster rung has no row: nothing to compare, say so
            lines.append(f"{w.resource} at {w.level}: what phases add is not measured (the forecasters with and "
                         "without phases were not both scored)")
        elif w.oracle_rung is None:  # no oracle rung: what the learned phases add, alone
            added = f"{w.learned_adds:+.1%} of the static allocation over a forecaster of recent usage"
            lines.append(f"{w.resource} at {w.level}: the learned phases "
                         + (f"add nothing ({added})" if not (w.learned_adds >= threshold) else f"add {added}"))
        elif not (w.perfect_adds >= threshold):
            lines.append(f"{w.resource} at {w.level}: phases add nothing on this fleet ({oracle} would add "
                         f"{w.perfect_adds:+.1%} of the static allocation to a forecaster of recent usage)")
        elif not (w.learned_adds >= threshold):
            lines.append(f"{w.resource} at {w.level}: {oracle} would add {w.perfect_adds:+.1%}, the learned phases "
                         f"add {w.learned_adds:+.1%} (nothing worth deploying)")
        else:
            lines.append(f"{w.resource} at {w.level}: the learned phases add {w.learned_adds:+.1%} of the static "
                         f"allocation ({w.learned_share_of_perfect:.0%} of the {w.perfect_adds:+.1%} {oracle} would add)")
    return lines


def rung_phases(phases: "DataFrame", rung: str, interval_steps: int) -> "DataFrame":
    """The ``PHASES`` rows with the ``phase`` column a rung's forecaster is given: ``c`` the true behaviour
    (its code in the sorted behaviour names), ``d`` the true behaviour ``interval_steps`` steps later (at the
    last step of the interval a decision is made for), ``d'`` the learned phase that many steps later; a step
    past the trace's end keeps its own."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if rung in ("c", "d"):
        names = sorted(r[0] for r in phases.select("behaviour").where(F.col("behaviour").isNotNull()).distinct().collect())
        code = F.array_position(F.array(*[F.lit(n) for n in names]), F.col("behaviour")) - 1
        phases = phases.withColumn("phase", F.when(F.col("behaviour").isNotNull(), code.cast("int")))
        if rung == "c":
            return phases
    elif rung != "d'":
        raise ValueError(f"rung {rung!r} has no phase swap (c, d, d')")
    ahead = F.lead("phase", int(interval_steps)).over(Window.partitionBy("pod_id").orderBy("step"))
    return phases.withColumn("phase", F.coalesce(ahead, F.col("phase")))


__all__ = ["BASELINES", "CLAIRVOYANT", "LADDER_COLUMNS", "Level", "RUNGS", "default_levels", "gap_closed", "ladder",
           "phase_worth", "rung_phases", "verdict"]

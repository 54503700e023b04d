"""The value-of-information ladder: every rung on the scale between the best baseline and clairvoyance, chosen on
training totals and scored on held-out ones; and a plain verdict where phases add nothing."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from ai4dl.policies.ladder import Level, default_levels, ladder, phase_worth, verdict

_COLS = ["policy", "resource", "knob", "containers", "hours", "steps", "met_steps", "allocated", "static_allocated",
         "oom_kills", "throttled_steps", "throttled_core_seconds"]


def _totals(alloc: dict[str, tuple[float, int]]) -> pd.DataFrame:
    """One knob per policy, CPU only: policy -> (allocated of 100, steps met of 100)."""
    rows = [(p, "cpu", math.nan if p in ("static", "current.step.max") else 1.0, 2, 10.0, 100, met, a, 100.0, 0, 100 - met, 0.0)
            for p, (a, met) in alloc.items()]
    return pd.DataFrame(rows, columns=_COLS)


BASE = {"static": (100.0, 100), "current.step.max": (50.0, 100), "prev.step.rules": (70.0, 96), "vpa": (75.0, 97),
        "phase.headroom": (68.0, 95)}


def test_rungs_on_the_gap_between_the_best_baseline_and_clairvoyance():
    learned = _totals({**BASE, "forecast": (66.0, 96), "phase.forecast": (62.0, 96)})
    oracle = _totals({**BASE, "forecast": (66.0, 96), "phase.forecast": (58.0, 97)})
    table = ladder({"a": (learned, learned), "b": (learned, learned), "d": (oracle, oracle)}, (Level("cpu", 0.95),))
    by = table.set_index("rung")
    assert by.loc["baseline", "policy"] == "prev.step.rules" and by.loc["baseline", "savings"] == pytest.approx(0.30)
    assert by.loc["clairvoyant", "savings"] == pytest.approx(0.50)
    assert by.loc["a", "gap_closed"] == pytest.approx(0.2) and by.loc["b", "gap_closed"] == pytest.approx(0.4)
    assert by.loc["d", "gap_closed"] == pytest.approx(0.6)
    assert by.loc["best", "policy"] == "phase.forecast"
    worth = phase_worth(table).iloc[0]
    assert worth["learned_adds"] == pytest.approx(0.04) and worth["perfect_adds"] == pytest.approx(0.08)
    assert worth["learned_share_of_perfect"] == pytest.approx(0.5)
    assert "the learned phases add +4.0%" in verdict(phase_worth(table))[0]


def test_a_level_missed_in_training_is_flagged_and_phases_worth_nothing_say_so():
    flat = _totals({**BASE, "forecast": (66.0, 96), "phase.forecast": (65.8, 96)})
    table = ladder({"a": (flat, flat), "b": (flat, flat), "d": (flat, flat)}, (Level("cpu", 0.97),))
    by = table.set_index("rung")
    assert not by.loc["a", "reached"] and by.loc["baseline", "policy"] == "vpa"
    assert verdict(phase_worth(table))[0].startswith("cpu at 97% of steps met: phases add nothing on this fleet")


def test_without_an_oracle_rung_the_verdict_says_what_the_learned_phases_add():
    learned = _totals({**BASE, "forecast": (66.0, 96), "phase.forecast": (62.0, 96)})
    flat = _totals({**BASE, "forecast": (66.0, 96), "phase.forecast": (65.8, 96)})
    lines = [verdict(phase_worth(ladder({"a": (t, t), "b": (t, t)}, (Level("cpu", 0.95),))))[0] for t in (learned, flat)]
    assert lines[0] == ("cpu at 95% of steps met: the learned phases add +4.0% of the static allocation over a "
                        "forecaster of recent usage")
    assert lines[1].startswith("cpu at 95% of steps met: the learned phases add nothing (+0.2% of the static")


def test_a_rung_without_its_policy_is_said_to_be_unmeasured_not_a_nan():
    """A forecaster rung whose policy has no rows (not fitted, or no container to calibrate it on) leaves what
    phases add unknown: the verdict says so instead of printing "+nan%"."""
    without = _totals(BASE)
    table = ladder({"a": (without, without), "b": (without, without)}, (Level("cpu", 0.95),))
    line = verdict(phase_worth(table))[0]
    assert line == ("cpu at 95% of steps met: what phases add is not measured (the forecasters with and without "
                    "phases were not both scored)")


def test_default_levels():
    labels = [(lv.resource, lv.label) for lv in default_levels(10.0)]
    assert labels == [("cpu", "95% of steps met"), ("cpu", "99% of steps met"), ("mem", "95% of steps met"),
                      ("mem", "99% of steps met"), ("mem", "<= 10 OOM kills per 100 container-hours")]

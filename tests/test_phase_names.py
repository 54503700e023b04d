"""Phases described in words and numbers (``ai4dl.behaviour.naming``), on hand-made statistics and steps."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ai4dl.behaviour.naming import PROFILE_COLUMNS, describe, name_phases, phase_name, phase_profile, utilisation


def _profile(rows):
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def test_names_follow_levels_variability_and_trend():
    profile = _profile([
        (0, 50, 0.5, 0.05, 0.01, 0.10, 0.0, 0.0, 0.0),     # little CPU, steady; little memory, flat
        (1, 30, 0.3, 0.80, 0.40, 0.90, 0.02, 0.0, 0.0),    # much CPU, varying; much memory, growing
        (2, 20, 0.2, 0.40, 0.05, 0.50, -0.02, 0.0, 0.0),   # middling CPU, steady; middling memory, shrinking
    ])
    named = describe(profile, cpu_cuts=(0.2, 0.6), mem_cuts=(0.3, 0.7), typical_change=0.05)
    assert {p: n for p, (n, _) in named.items()} == {
        0: "low steady CPU, memory light and flat",
        1: "high variable CPU, memory heavy and rising",
        2: "moderate steady CPU, memory moderate and falling",
    }
    assert named[1][1] == ("high variable CPU, memory heavy and rising: CPU 80% of limit (sd 40%); "
                           "memory 90% of limit, +2.00 points per step; 30% of steps")


def test_a_change_below_the_fleets_typical_change_is_flat_and_equal_words_get_what_differs():
    profile = _profile([(0, 5, 0.5, 0.7, 0.0, 0.2, 0.001, 0.0, 0.0), (1, 5, 0.5, 0.9, 0.0, 0.25, -0.001, 0.0, 0.0)])
    named = describe(profile, cpu_cuts=(0.2, 0.6), mem_cuts=(0.3, 0.7), typical_change=0.05)
    assert named[0][0] == "high steady CPU, memory light and flat (CPU 70%)"
    assert named[1][0] == "high steady CPU, memory light and flat (CPU 90%)"
    assert named[1][1].startswith("high steady CPU, memory light and flat (CPU 90%): CPU 90%")
    same_cpu = _profile([(0, 5, 0.5, 0.7, 0.0, 0.2, 0.0, 0.0, 0.0), (1, 5, 0.5, 0.7, 0.0, 0.25, 0.0, 0.0, 0.0),
                         (2, 5, 0.5, 0.7, 0.0, 0.25, 0.0, 0.0, 0.0)])
    names = [n for n, _ in describe(same_cpu, (0.2, 0.6), (0.3, 0.7), 0.05).values()]
    assert names == ["high steady CPU, memory light and flat (memory 20%, phase 0)",
                     "high steady CPU, memory light and flat (memory 25%, phase 1)",
                     "high steady CPU, memory light and flat (memory 25%, phase 2)"]  # identical profiles: numbers
    assert len(set(names)) == 3


def test_a_memory_sawtooth_says_so():
    """Memory that climbs through a stretch and drops back (a training epoch's saw): rising, in a sawtooth."""
    phases = np.zeros(200)
    mem = 0.3 + 0.004 * (np.arange(200) % 25)  # climbs 0.1 over 25 steps, then drops back
    before = np.r_[mem[0], mem[:-1]]
    cpu = np.full(200, 0.5)
    steady = np.full(200, 0.3)  # a second, flat phase sets the fleet's typical change
    info = name_phases(np.r_[phases, np.ones(200)], np.c_[np.r_[cpu, cpu] * 100, np.r_[mem, steady] * 100],
                       np.c_[np.r_[cpu, cpu] * 100, np.r_[before, steady] * 100], ["cpu_usage_pct", "mem_usage_pct"])
    assert info["phase_names"]["0"].endswith("and rising in a sawtooth"), info["phase_names"]
    assert info["phase_names"]["1"].endswith("and flat"), info["phase_names"]
    noisy = np.r_[0.3 + 0.002 * np.arange(200) + np.where(np.arange(200) % 25 == 0, 0.1, 0.0)]  # spikes up and back
    info = name_phases(np.r_[phases, np.ones(200)], np.c_[np.r_[cpu, cpu] * 100, np.r_[noisy, steady] * 100],
                       np.c_[np.r_[cpu, cpu] * 100, np.r_[np.r_[noisy[0], noisy[:-1]], steady] * 100],
                       ["cpu_usage_pct", "mem_usage_pct"])
    assert info["phase_names"]["0"].endswith("and swinging"), info["phase_names"]


def test_without_memory_or_cpu_features_only_what_is_known_is_said():
    profile = _profile([(3, 5, 1.0, 0.3, 0.0, np.nan, np.nan, np.nan, np.nan)])
    assert describe(profile, (0.2, 0.6), None, None)[3][0] == "moderate steady CPU"
    assert describe(profile, None, None, None)[3][0] == "phase 3"


def test_utilisation_prefers_percentages_then_usage_over_limit():
    raw = np.array([[50.0, 2.0, 4.0, 1.0, 4.0]])
    cpu, mem = utilisation(raw, ["cpu_usage_pct", "cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit"])
    assert cpu[0] == 0.5 and mem[0] == 0.25
    cpu, mem = utilisation(raw[:, 1:], ["cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit"])
    assert cpu[0] == 0.5 and mem[0] == 0.25
    cpu, mem = utilisation(raw[:, :1], ["cpu_usage"])
    assert cpu is None and mem is None


def test_profile_and_names_from_labelled_steps():
    """Two behaviours made by hand: phase 0 idles with flat memory, phase 1 computes hard while memory grows."""
    rng = np.random.default_rng(0)
    n = 200
    phases = np.repeat([0.0, 1.0, np.nan], [n, n, 10])
    cpu = np.concatenate([rng.uniform(0.02, 0.04, n), rng.uniform(0.05, 0.95, n), np.zeros(10)])
    mem = np.concatenate([np.full(n, 0.2), np.linspace(0.3, 0.9, n), np.zeros(10)])
    before = np.concatenate([np.full(n, 0.2), np.linspace(0.3, 0.9, n) - 0.6 / n, np.zeros(10)])
    profile = phase_profile(phases, cpu, mem, before)
    assert profile["phase"].tolist() == [0, 1] and profile["steps"].tolist() == [n, n]
    assert np.isclose(profile["mem_change"].iloc[1], 0.6 / n) and profile["mem_change"].iloc[0] == 0.0

    features = ["cpu_usage_pct", "mem_usage_pct"]
    info = name_phases(phases, np.c_[cpu * 100, mem * 100], np.c_[cpu * 100, before * 100], features)
    assert info["phase_names"]["0"] == "low steady CPU, memory light and flat"
    assert info["phase_names"]["1"].startswith("high variable CPU, memory heavy and rising")
    assert set(info["phase_profile"]) == set(PROFILE_COLUMNS)


def test_memory_loaded_at_once_then_held_is_flat_not_rising():
    """A phase entered by a jump of memory, then steady: its first step changes a lot, its median step not."""
    phases = np.array([0.0] * 20 + [1.0] * 20)
    mem = np.r_[np.linspace(0.1, 0.3, 20), np.full(20, 0.8)]
    before = np.r_[mem[0] - 0.01, mem[:-1]]
    cpu = np.full(40, 0.5)
    profile = phase_profile(phases, cpu, mem, before)
    assert profile["mem_change"].iloc[1] == 0.0 and profile["mem_change"].iloc[0] > 0
    named = name_phases(phases, np.c_[cpu * 100, mem * 100], np.c_[cpu * 100, before * 100], ["cpu_usage_pct", "mem_usage_pct"])
    assert named["phase_names"]["1"].endswith("memory heavy and flat")
    assert named["phase_names"]["0"].endswith("memory light and rising")


def test_a_model_without_names_says_phase_k():
    assert phase_name({}, 2) == "phase 2" and phase_name(None, 2.0) == "phase 2" and phase_name({}, None) is None
    assert phase_name({"phase_names": {"2": "low steady CPU"}}, 2) == "low steady CPU"

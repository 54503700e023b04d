"""Allocation policies: hand-computed allocations, invariants, the fleet replay and its summary."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ai4dl.config import POLICIES, PoliciesConfig
from ai4dl.errors import ConfigError, InputError
from ai4dl.lake.schema import POLICY_FRONTIER, POLICY_REPLAY
from ai4dl.method.split import ContainerSplit
from ai4dl.policies.calibration import ServiceLevel, calibrate, choose_knob
from ai4dl.policies.fleet import replay_fleet, summarise
from ai4dl.policies.formatting import format_comparison
from ai4dl.policies.model import absolute_statistics
from ai4dl.policies.nextphase import next_phase_f1
from ai4dl.policies.replay import (
    FRONTIER_COLUMNS,
    Trace,
    allocate,
    allocations,
    container_jumps,
    replay_container,
    replay_container_grid,
    step_durations,
)
from ai4dl.policies.rules import (
    HEADROOM_LEVELS, KNOBS, closed_loop, headroom_tables, jumps_of, oom_bump, oom_step, vpa_params,
)
from ai4dl.policies.vpa import VpaRecommender

USAGE8 = np.arange(1.0, 9.0)  # [1, 2, ..., 8]
P4 = PoliciesConfig(interval_steps=4, k_std=1.0, margin=0.0, vpa_percentile=0.4)
R1 = 2.5 + np.sqrt(1.25)  # mean + 1 * population std of [1, 2, 3, 4]
R2 = 6.5 + np.sqrt(1.25)  # ... of [5, 6, 7, 8]


# ------------------------------------------------------------------------------------- hand-made traces


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("static", [10, 10, 10, 10, 10, 10, 10, 10]),
        ("current.step.max", [4, 4, 4, 4, 8, 8, 8, 8]),
        ("current.step.rules", [R1, R1, R1, R1, R2, R2, R2, R2]),
        ("prev.step.max", [10, 10, 10, 10, 4, 4, 4, 4]),
        ("prev.step.rules", [10, 10, 10, 10, R1, R1, R1, R1]),
        # VPA: four CPU samples of ~equal weight (half-life 1200 s, 10 s apart); 0.4 of the weight is reached in
        # the bucket of 2 cores, whose upper edge is 0.2 * (1.05**50 - 1) = 2.0935 -> 2093 m, + int(2093 * 0.15)
        ("vpa", [10, 10, 10, 10, 2.406, 2.406, 2.406, 2.406]),
        ("phase.rule", [10, 10, 10, 10, 10, 10, 10, 10]),  # no phases given: the limit
        ("phase.proactive", [10, 10, 10, 10, 10, 10, 10, 10]),
        ("phase.headroom", [10, 10, 10, 10, 10, 10, 10, 10]),
    ],
)
def test_hand_computed_allocations(policy, expected):
    got = allocate(policy, USAGE8, 10.0, P4)
    np.testing.assert_allclose(got, np.asarray(expected, dtype=float), rtol=1e-12)


def test_rules_values_literal():
    got = allocate("current.step.rules", USAGE8, 10.0, P4)
    np.testing.assert_allclose(got[[0, 4]], [3.6180339887498949, 7.6180339887498949], rtol=1e-12)


def test_vpa_hand_computed_three_intervals_and_margin():
    usage = np.arange(1.0, 13.0)
    # interval 2: samples 1..8; 0.4 of the weight is reached in the bucket of 4 cores, upper edge
    # 0.2 * (1.05**63 - 1) = 4.1246 -> 4124 m; VPA's margin adds int(4124 * 0.15) = 618 m
    np.testing.assert_allclose(allocate("vpa", usage, 10.0, P4), [10] * 4 + [2.406] * 4 + [4.742] * 4)
    no_margin = PoliciesConfig(interval_steps=4, vpa_percentile=0.4, vpa_margin=0.0)
    np.testing.assert_allclose(allocate("vpa", usage, 10.0, no_margin), [10] * 4 + [2.093] * 4 + [4.124] * 4)
    # the generic margin is not VPA's
    generic = PoliciesConfig(interval_steps=4, vpa_percentile=0.4, vpa_margin=0.0, margin=0.5)
    np.testing.assert_allclose(allocate("vpa", usage, 10.0, generic), allocate("vpa", usage, 10.0, no_margin))


def test_the_memory_closed_loop_is_oom_step_taken_step_by_step():
    """closed_loop writes oom_step out for speed and skips the calm intervals: on traces with unknown usage,
    unknown and zero limits, missing decisions and kills at interval starts, it must give what stepping
    oom_step through every step gives (the live stream's arithmetic)."""
    rng = np.random.default_rng(3)
    for trial in range(40):
        n, length = int(rng.integers(1, 60)), int(rng.integers(1, 7))
        usage = rng.uniform(0.0, 2e9, n)
        usage[rng.random(n) < 0.1] = np.nan
        lim = np.full(n, 1.5e9)
        lim[rng.random(n) < 0.1] = np.nan
        lim[rng.random(n) < 0.05] = 0.0
        n_int = -(-n // length)
        decisions = rng.uniform(0.0, 2e9, n_int) if trial % 3 else np.full(n_int, 1e9)  # equal allocations too
        decisions[rng.random(n_int) < 0.2] = np.nan
        want_a, want_k = np.empty(n), np.zeros(n, dtype=bool)
        prev_over, prev_alloc = False, float("nan")
        for i in range(n_int):
            d = float(decisions[i])
            for t in range(i * length, min((i + 1) * length, n)):
                want_a[t], prev_over, want_k[t] = oom_step(d, usage[t], lim[t], prev_over, prev_alloc)
                if want_k[t]:
                    d = max(want_a[t], oom_bump(usage[t]))
                prev_alloc = want_a[t]
        got_a, got_k = closed_loop(decisions, usage, lim, length)
        np.testing.assert_array_equal(got_a, want_a)
        np.testing.assert_array_equal(got_k, want_k)


def test_vpa_memory_is_one_peak_per_window_and_bumped_by_ooms():
    from ai4dl.policies.vpa import recommend_trace

    p = PoliciesConfig(interval_steps=4, vpa_percentile=0.4, vpa_margin=0.0)
    # 12 samples 10 s apart all fall in one 1200 s peak window: one histogram entry, the window's peak so far
    # (4e9): a bucket's upper edge, whatever the percentile, and lower samples after it change nothing
    usage = np.array([1.0, 2, 3, 4, 3, 3, 3, 3, 2, 2, 2, 2]) * 1e9
    got = allocate("vpa", usage, 1e11, p, resource="mem")
    np.testing.assert_allclose(got, [1e11] * 4 + [4124698510.0] * 8, rtol=1e-9)
    # a ramp of 1 GB per step outgrows the targets: each kill's bump (1.2 x the allocation in force) lifts the
    # window's peak and the pod restarts on the new target, which the ramp outgrows again or not
    ramp = np.arange(1.0, 13.0) * 1e9
    trace = Trace({}, None, None, np.full(12, 10.0), {"mem": ramp}, {"mem": np.full(12, 1e11)})
    got, kills = allocations("vpa", trace, "mem", p)
    assert np.flatnonzero(kills).tolist() == [4, 5, 6, 7, 9, 11]
    assert got[4] == pytest.approx(4124698510.0, rel=1e-9) and np.all(np.diff(got[4:8]) > 0) and got[8] == got[9]
    # usage above the allocation in force is an OOM kill, reported to VPA (RecordOOM, as the harness's closed
    # loop does), after which the pod runs on VPA's new target: 4.8e9 exceeds the 4.74e9 target of interval 1,
    # the OOM bump records max(1.2 x 4.74e9, +100 MiB) and the rest of the interval gets the bumped target
    usage = np.array([4e9] * 4 + [4.8e9] * 8)
    vpa = vpa_params(PoliciesConfig(interval_steps=4), timed=False)
    want = recommend_trace(np.arange(12) * 10.0, usage / 1e9, usage, 4, dataclasses.replace(vpa, oom_on_shortfall=True))
    assert want.attrs["oom_events"] == 1
    params = PoliciesConfig(interval_steps=4)
    trace = Trace({}, None, None, np.full(12, 10.0), {"mem": usage}, {"mem": np.full(12, 1e15)})
    got, kills = allocations("vpa", trace, "mem", params)
    assert kills.tolist() == [False] * 4 + [True] + [False] * 7  # one kill: the bumped target holds 4.8e9
    np.testing.assert_array_equal(got[[4, 8]], want["mem_target"].to_numpy()[1:])  # each interval's decision: VPA's
    assert got[5] == got[6] == got[7] > 1.2 * got[4] and got[5] > usage[5]
    no_oom = recommend_trace(np.arange(12) * 10.0, usage / 1e9, usage, 4, vpa)
    assert want["mem_target"].iloc[2] > 1.2 * no_oom["mem_target"].iloc[2]  # the OOM bump lifted the target


def test_phase_rule_uses_last_phase_before_interval():
    usage = np.ones(16)
    phases = np.array([None, None, 0, 0, 0, 1, 1, None, 2, 2, 2, 2, 3, 3, 3, 3], dtype=object)
    stats = {0: {"cpu": 2.0, "mem": 20.0}, 1: {"cpu": 4.0, "mem": 40.0}, 3: {"cpu": 99.0, "mem": 1.0}}
    p = PoliciesConfig(interval_steps=4, margin=0.1)
    # interval 0: nothing seen -> limit; 1: step 3's phase 0; 2: step 7 is unlabelled, step 6's phase 1;
    # 3: phase 2 has no statistics -> limit
    np.testing.assert_allclose(
        allocate("phase.rule", usage, 10.0, p, phases, stats, "cpu"), [10] * 4 + [2.2] * 4 + [4.4] * 4 + [10] * 4
    )
    np.testing.assert_allclose(
        allocate("phase.rule", usage, 100.0, p, phases, stats, "mem"), [100] * 4 + [22] * 4 + [44] * 4 + [100] * 4
    )
    # phase 3 (seen before a fifth interval) asks for 99 * 1.1 cores: capped at the limit
    usage20 = np.ones(20)
    phases20 = np.concatenate([phases, np.array([3, 3, 3, 3], dtype=object)])
    got = allocate("phase.rule", usage20, 10.0, p, phases20, stats, "cpu")
    np.testing.assert_allclose(got[16:], [10] * 4)


def test_phase_rule_accepts_float_phases_and_string_keys():
    usage = np.ones(8)
    phases = np.array([np.nan, 1.0, 1.0, 1.0, np.nan, np.nan, np.nan, np.nan])
    got = allocate("phase.rule", usage, 10.0, PoliciesConfig(interval_steps=4, margin=0.0), phases, {"1": {"cpu": 3}})
    np.testing.assert_allclose(got, [10] * 4 + [3] * 4)


def test_allocations_capped_at_limit_and_non_negative():
    usage = np.array([5.0, 20.0, 5.0, 20.0, 0.0, 0.0, 0.0, 0.0, 30.0, 1.0])
    p = PoliciesConfig(interval_steps=4, k_std=3.0, margin=0.5, vpa_percentile=1.0, vpa_cpu_half_life_s=50)
    stats = {0: {"cpu": 1e9}}
    phases = np.zeros(len(usage))
    for policy in POLICIES:
        got = allocate(policy, usage, 10.0, p, phases, stats)
        assert got.shape == usage.shape
        assert np.all(got <= 10.0) and np.all(got >= 0.0), policy
    # usage above the limit is not met even by the oracle
    assert allocate("current.step.max", usage, 10.0, p)[1] == 10.0
    # negative (broken) samples never give a negative allocation
    assert np.all(allocate("current.step.max", -usage, 10.0, p) >= 0.0)


def test_per_step_limit_and_null_usage():
    usage = np.array([1.0, np.nan, 3.0, 2.0, np.nan, np.nan, np.nan, np.nan, 1.0])
    limit = np.array([5.0] * 4 + [6.0] * 5)
    p = PoliciesConfig(interval_steps=4, k_std=0.0)
    np.testing.assert_allclose(allocate("static", usage, limit, p), limit)
    np.testing.assert_allclose(allocate("current.step.max", usage, limit, p), [3, 3, 3, 3, 6, 6, 6, 6, 1])
    # interval 2 reacts to interval 1, which has no usage: the limit
    np.testing.assert_allclose(allocate("prev.step.max", usage, limit, p), [5, 5, 5, 5, 3, 3, 3, 3, 6])
    np.testing.assert_allclose(allocate("prev.step.rules", usage, limit, p), [5] * 4 + [2] * 4 + [6])


def test_unknown_policy_rejected():
    with pytest.raises(ValueError, match="unknown policy"):
        allocate("best.guess", USAGE8, 10.0, P4)


def test_the_policies_section_is_the_replays_parameters():
    """One declaration: the config section the replay reads, validated however it is built."""
    from ai4dl.config import Config, from_dict

    assert Config().policies == PoliciesConfig()
    assert from_dict({"policies": {"interval_steps": 3}}).policies == PoliciesConfig(interval_steps=3)
    for bad in ({"interval_steps": 0}, {"k_std": -1.0}, {"vpa_percentile": 1.5}, {"phase_statistic": "median"}):
        with pytest.raises(ConfigError, match=f"policies.{next(iter(bad))}"):
            PoliciesConfig(**bad)
    assert vpa_params(PoliciesConfig(vpa_percentile=0.8), timed=True).target_memory_percentile == 0.8


# ------------------------------------------------------------------------------------------- properties


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=200),
    limit=st.floats(0.5, 64.0),
    interval=st.integers(1, 25),
)
def test_oracle_max_never_under_provisions(data, limit, interval):
    usage = np.asarray(data) * limit  # within the limit
    alloc = allocate("current.step.max", usage, limit, PoliciesConfig(interval_steps=interval))
    assert np.all(alloc >= usage)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(st.one_of(st.floats(0.0, 100.0), st.just(float("nan"))), min_size=1, max_size=120),
    interval=st.integers(1, 12),
    k=st.floats(0.0, 4.0),
    margin=st.floats(0.0, 1.0),
    q=st.floats(0.0, 1.0),
)
def test_every_policy_within_zero_and_limit(data, interval, k, margin, q):
    usage = np.asarray(data, dtype=float)
    p = PoliciesConfig(interval_steps=interval, k_std=k, margin=margin, vpa_percentile=q, vpa_cpu_half_life_s=70,
                     vpa_mem_half_life_s=70, vpa_mem_interval_s=30)
    phases = np.arange(len(usage)) % 3
    stats = {0: {"cpu": 5.0, "mem": 5.0}, 1: {"cpu": 500.0, "mem": 500.0}}
    transitions = {(0, 1): 0.5, (1, 2): 1.0, (2, 0): 1.0}
    for policy in POLICIES:
        for resource in ("cpu", "mem"):
            alloc = allocate(policy, usage, 50.0, p, phases, stats, resource, transitions=transitions)
            assert alloc.shape == usage.shape
            assert np.all((alloc >= 0.0) & (alloc <= 50.0)), policy


def test_vpa_on_stationary_trace_approaches_percentile():
    rng = np.random.default_rng(0)
    usage = rng.uniform(0.0, 1.0, 2000)
    p = PoliciesConfig(interval_steps=10, vpa_percentile=0.9, vpa_margin=0.0)
    alloc = allocate("vpa", usage, 2.0, p)  # (how fast is bench/policy_savings.py's business, not a test's)
    np.testing.assert_allclose(alloc[:10], 2.0)  # no history: the limit
    late = alloc[1000:]
    # the p90 rounded up to its bucket's upper edge (buckets 5 % wide)
    assert np.all((late >= 0.88) & (late <= 0.9 * 1.05 + 0.02))


# ------------------------------------------------------------------------------------- replay_container


def _container(pod, service, cpu, cpu_limit, mem, mem_limit, phases=None):
    n = len(cpu)
    start = datetime(2024, 1, 1)
    return pd.DataFrame(
        {
            "pod_id": pod,
            "service": service,
            "ts": [start + timedelta(seconds=30 * i) for i in range(n)],
            "step": np.arange(n, dtype="int32"),
            "phase": phases if phases is not None else [None] * n,
            "distance": [None] * n,
            "activations": [None] * n,
            "cpu_usage_cores": cpu,
            "cpu_num_cores": [cpu_limit] * n,
            "mem_current": mem,
            "mem_limit": [mem_limit] * n,
            "behaviour": [None] * n,
            "model_id": "m1",
        }
    )


def test_replay_container_rows_and_metrics():
    pdf = _container("a", "svc", list(USAGE8), 10.0, [100.0] * 8, 200.0)
    out = replay_container(pdf.sample(frac=1.0, random_state=1), P4, None)  # unsorted input
    assert list(out.columns) == [f.name for f in POLICY_REPLAY.fields]
    assert len(out) == 2 * len(POLICIES)
    row = out[(out.policy == "prev.step.rules") & (out.resource == "cpu")].iloc[0]
    assert row.steps == 8 and row.used == 36.0 and row.static_allocated == 80.0
    assert row.allocated == pytest.approx(40.0 + 4 * R1)
    assert row.met_steps == 4 and row.shortfall_steps == 4
    assert row.shortfall_total == pytest.approx(26.0 - 4 * R1)
    assert row.shortfall_max == pytest.approx(8.0 - R1)
    mem = out[(out.policy == "current.step.max") & (out.resource == "mem")].iloc[0]
    assert mem.allocated == 800.0 and mem.met_steps == 8 and mem.shortfall_total == 0.0


def test_replay_container_skips_null_usage():
    cpu = [1.0, None, 3.0, 4.0, 5.0, 6.0]
    pdf = _container("a", "svc", cpu, 10.0, [1.0] * 6, 2.0)
    out = replay_container(pdf, P4, None)
    static = out[(out.policy == "static") & (out.resource == "cpu")].iloc[0]
    assert static.steps == 5 and static.used == 19.0 and static.static_allocated == 50.0
    assert out[out.resource == "mem"].steps.eq(6).all()


# ------------------------------------------------------------------------------------------- fleet level


def _fleet_pdf():
    a = _container("a", "svc1", list(USAGE8), 10.0, [100.0] * 8, 200.0, [None, 0, 0, 1, 1, 1, 0, 0])
    b = _container("b", "svc2", [2.0] * 4, 4.0, [50.0] * 4, 100.0, [None, 1, 1, 1])
    return a, b


def _spark_df(spark, pdfs):
    from ai4dl.lake.schema import PHASES

    rows = []
    for pdf in pdfs:
        for r in pdf.itertuples(index=False):
            rows.append(
                (
                    r.pod_id,
                    r.service,
                    pd.Timestamp(r.ts).to_pydatetime(),
                    int(r.step),
                    None if r.phase is None or pd.isna(r.phase) else int(r.phase),
                    None,
                    None,
                    None if pd.isna(r.cpu_usage_cores) else float(r.cpu_usage_cores),
                    float(r.cpu_num_cores),
                    float(r.mem_current),
                    float(r.mem_limit),
                    None,
                    r.model_id,
                )
            )
    return spark.createDataFrame(rows, PHASES)


def test_summarise_arithmetic(spark):
    a, b = _fleet_pdf()
    pdf = pd.concat([replay_container(a, P4, None), replay_container(b, P4, None)], ignore_index=True)
    replay = spark.createDataFrame(pdf, POLICY_REPLAY)
    s = summarise(replay).toPandas()
    assert list(s.resource.unique()) == ["cpu", "mem"]
    assert list(s[s.resource == "cpu"].policy) == list(POLICIES)
    cpu = s[s.resource == "cpu"].set_index("policy")
    prev_rules = 40.0 + 4 * R1 + 16.0  # a: limit, then mean+std of [1..4]; b: one interval at the limit
    assert (cpu.containers == 2).all()
    assert cpu.loc["static", "allocated"] == 96.0 and cpu.loc["static", "savings_vs_static"] == 0.0
    assert cpu.loc["static", "fulfilment"] == 1.0
    assert cpu.loc["static", "utilisation"] == pytest.approx(44.0 / 96.0)
    assert cpu.loc["current.step.max", "allocated"] == 56.0  # a: 4*4 + 8*4, b: 2*4
    assert cpu.loc["current.step.max", "savings_vs_static"] == pytest.approx(1 - 56.0 / 96.0)
    assert cpu.loc["current.step.max", "savings_vs_prev_rules"] == pytest.approx(1 - 56.0 / prev_rules)
    assert cpu.loc["current.step.max", "fulfilment"] == 1.0
    assert cpu.loc["prev.step.rules", "allocated"] == pytest.approx(prev_rules)
    assert cpu.loc["prev.step.rules", "savings_vs_prev_rules"] == 0.0
    assert cpu.loc["prev.step.rules", "fulfilment"] == pytest.approx(8.0 / 12.0)
    assert cpu.loc["prev.step.max", "allocated"] == 72.0
    assert cpu.loc["prev.step.max", "shortfall_steps"] == 4
    assert cpu.loc["prev.step.max", "shortfall_total"] == 10.0  # (5-4) + (6-4) + (7-4) + (8-4)
    assert cpu.loc["prev.step.max", "shortfall_max"] == 4.0
    mem = s[s.resource == "mem"].set_index("policy")
    assert mem.loc["prev.step.rules", "savings_vs_prev_rules"] == 0.0
    assert mem.loc["current.step.max", "savings_vs_static"] == pytest.approx(1 - 1000.0 / 2000.0)
    assert cpu.loc["static", "hours"] == pytest.approx((8 + 4) * 30 / 3600)  # a sample lasts until the next


def test_replay_fleet_equals_pandas_replay(spark):
    a, b = _fleet_pdf()
    c = _container("c", "svc1", [0.5, None, 2.5, 1.0, 3.0, 0.2, 0.1], 3.0, [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0], 10.0,
                   [None, None, 2, 2, 0, None, 1])
    stats = {0: {"cpu": 3.0, "mem": 150.0}, 1: {"cpu": 1.5, "mem": 60.0}, 2: {"cpu": 2.0, "mem": 8.0}}
    params = PoliciesConfig(interval_steps=3, k_std=1.5, margin=0.1, vpa_percentile=0.8, vpa_cpu_half_life_s=40)
    got = replay_fleet(_spark_df(spark, [a, b, c]), params, stats).toPandas()
    want = pd.concat([replay_container(pdf, params, stats) for pdf in (a, b, c)])
    key = ["pod_id", "resource", "policy"]
    got = got.sort_values(key).reset_index(drop=True)
    want = want.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12)
    assert len(got) == 3 * 2 * len(POLICIES)


def test_absolute_statistics():
    pdf = pd.DataFrame(
        {
            "phase": [0, 1, 0, None],
            "service": ["__all__", "__all__", "svc1", "__all__"],
            "cpu_p95": [1.5, 2.5, 9.0, 7.0],
            "mem_p95": [100.0, None, 9.0, 7.0],
            "cpu_p99": [1.9, 2.9, 9.0, 7.0],
            "mem_p99": [110.0, 210.0, 9.0, 7.0],
        }
    )
    got = absolute_statistics(pdf)
    assert got.keys() == {0, 1}
    assert got[0] == {"cpu": 1.5, "mem": 100.0}
    assert got[1]["cpu"] == 2.5 and np.isnan(got[1]["mem"])
    assert absolute_statistics(pdf, ("cpu_p99", "mem_p99"))[1] == {"cpu": 2.9, "mem": 210.0}
    # a NaN statistic falls back to the limit in phase.rule
    alloc = allocate("phase.rule", np.ones(4), 500.0, PoliciesConfig(interval_steps=2), [1, 1, 1, 1], got, "mem")
    np.testing.assert_allclose(alloc, [500.0] * 4)
    with pytest.raises(ValueError, match="lack"):
        absolute_statistics(pdf, ("cpu_p50", "mem_p50"))


def test_phase_rule_with_fractions_of_the_limit(spark):
    # phase 1 uses 20% of the limit, phase 2 40%; the rule allocates that share of each container's own limit
    stats = {1: {"cpu_fraction": 0.2, "mem_fraction": 0.5}, 2: {"cpu_fraction": 0.4, "mem_fraction": 0.5}}
    usage = np.array([1.0, 1, 1, 1, 1, 1, 1, 1])
    phases = [1, 1, 1, 1, 2, 2, 2, 2]
    p = PoliciesConfig(interval_steps=4, margin=0.0)
    np.testing.assert_allclose(allocate("phase.rule", usage, 10.0, p, phases, stats, "cpu"), [10] * 4 + [2.0] * 4)
    np.testing.assert_allclose(allocate("phase.rule", usage, 40.0, p, phases, stats, "cpu"), [40] * 4 + [8.0] * 4)

    from ai4dl.policies.fleet import phase_fraction_stats
    from ai4dl.lake.schema import PHASES

    t0 = datetime(2024, 1, 1)
    rows = [
        ("a", "s", t0, i, ph, None, None, cpu, 4.0, mem, 100.0, None, "m")
        for i, (ph, cpu, mem) in enumerate([(0, 1.0, 10.0), (0, 2.0, 20.0), (1, 4.0, 100.0)])
    ]
    got = phase_fraction_stats(spark.createDataFrame(rows, PHASES), quantile=1.0)
    assert got == {0: {"cpu_fraction": 0.5, "mem_fraction": 0.2}, 1: {"cpu_fraction": 1.0, "mem_fraction": 1.0}}


# ------------------------------------------------------------------------------------------ exact VPA policy


@pytest.fixture(scope="module")
def vpa_vectors(project_root):
    d = project_root.parent / "shared" / "data" / "vpa"
    if not (d / "dlaas.generic.csv").is_file():
        pytest.skip(f"VPA conformance vectors not present: {d}")
    return d


def _generic_traces(path):
    """pod -> (timestamps, cpu, mem) in feeding order, from a ``*.generic.csv`` conformance input."""
    df = pd.read_csv(path).sort_values(["pod_id", "timestamp_seconds"], kind="stable")
    return {pod: (g["timestamp_seconds"].to_numpy(float), g["cpu_cores_used"].to_numpy(float),
                  g["memory_bytes_used"].to_numpy(float)) for pod, g in df.groupby("pod_id", sort=False)}


def _decisions(alloc, interval=10):
    """The allocation of each interval (its first step's)."""
    return alloc[::interval]


def _vpa_decisions(usage, ts, params, resource):
    """The vpa policy's decision of each interval and the first interval with an OOM kill (None: no kill)."""
    n = len(usage)
    trace = Trace({}, None, ts, np.full(n, 10.0), {resource: usage}, {resource: np.full(n, 1e15)})
    alloc, kills = allocations("vpa", trace, resource, params)
    first = int(np.flatnonzero(kills)[0]) // params.interval_steps if kills.any() else None
    return _decisions(alloc, params.interval_steps), first


@pytest.mark.parametrize("timed", [False, True], ids=["step-seconds", "timestamps"])
def test_vpa_policy_equals_the_recommender_on_dlaas(vpa_vectors, timed):
    """CPU: every decision is the recommender's. Memory: the same until the first OOM kill; from there the harness
    records one OOM per interval and carries on at the same target, while a killed pod restarts under VPA's bumped
    target (the memory accounting of ai4dl.policies.rules), so the histograms part ways on purpose."""
    from ai4dl.policies.vpa import recommend_trace

    params = PoliciesConfig(interval_steps=10)  # the defaults are the harness's "matched" flags
    vpa = dataclasses.replace(vpa_params(params, timed), oom_on_shortfall=True)
    checked = 0
    for pod, (ts, cpu, mem) in _generic_traces(vpa_vectors / "dlaas.generic.csv").items():
        want = recommend_trace(ts, cpu, mem, 10, vpa)
        has = want["cpu_target"].notna().to_numpy()
        for resource, usage in (("cpu", cpu), ("mem", mem)):
            got, first_kill = _vpa_decisions(usage, ts if timed else None, params, resource)
            upto = len(got) if resource == "cpu" or first_kill is None else first_kill + 1
            target = want[f"{resource}_target"].to_numpy()
            np.testing.assert_array_equal(got[:upto][has[:upto]], target[:upto][has[:upto]], err_msg=f"{pod} {resource}")
            assert np.all(got[~has] == 1e15)  # no recommendation yet: the limit
            checked += int(has[:upto].sum())
    assert checked >= 30


def test_vpa_policy_equals_the_real_vpa_closed_loop(vpa_vectors):
    """The Go recommender's own output with -oom-on-shortfall (matched flags), decision by decision: every CPU
    decision, and every memory decision up to a container's first OOM kill (see the test above)."""
    want = pd.read_csv(vpa_vectors / "fleet.vpa.matched.oom.rec.csv")
    traces = _generic_traces(vpa_vectors / "fleet.generic.csv")
    params = PoliciesConfig(interval_steps=10)
    same = differ = 0
    for pod in traces:
        ts, cpu, mem = traces[pod]
        rec = want[want["pod_id"] == pod]
        has = rec["cpu_target"].notna().to_numpy()
        for resource, usage in (("cpu", cpu), ("mem", mem)):
            got, first_kill = _vpa_decisions(usage, None, params, resource)
            target = rec[f"{resource}_target"].to_numpy()
            upto = len(got) if resource == "cpu" or first_kill is None else first_kill + 1
            np.testing.assert_array_equal(got[:upto][has[:upto]], target[:upto][has[:upto]], err_msg=f"{pod} {resource}")
            if resource == "mem":
                same += int(np.sum(got[has] == target[has]))
                differ += int(np.sum(got[has] != target[has]))
    assert same > differ  # most memory decisions of the fleet's closed loop are still the harness's


def _vpa_fed_sample_by_sample(usage, limit, params, resource, ts_seconds=None):
    """The vpa policy's allocation as ai4dl.policies.rules states it, one sample at a time: before each interval
    the target for the samples so far (none yet: the limit); memory above the allocation in force is an OOM kill
    (not when the step before was above the same allocation), recorded before the sample itself, after which the
    allocation is the recommender's new target."""
    timed = ts_seconds is not None
    rec = VpaRecommender(vpa_params(params, timed))
    length, n = params.interval_steps, len(usage)
    alloc = np.empty(n)
    prev_over, prev_alloc = False, np.nan
    for start in range(0, n, length):
        target = rec.target(resource, None) if start > 0 else None
        decision = np.nan if target is None else target
        for k in range(start, min(start + length, n)):
            if decision != decision:
                in_force = limit[k]
            else:
                in_force = decision if limit[k] != limit[k] else min(decision, limit[k])
                in_force = max(in_force, 0.0)
            alloc[k] = in_force
            v = usage[k]
            over = v > in_force
            killed = resource == "mem" and over and not (prev_over and in_force == prev_alloc)
            prev_over, prev_alloc = over, in_force
            if not v >= 0 or (timed and ts_seconds[k] != ts_seconds[k]):
                continue
            t = VpaRecommender.time_ns(ts_seconds[k]) if timed else VpaRecommender.time_ns(step=k, step_seconds=params.vpa_step_seconds)
            if resource == "cpu":
                rec.add_cpu_at(t, VpaRecommender.cpu_amount(v))
                continue
            if killed:
                rec.record_oom_at(t, in_force)
            rec.add_memory_at(t, VpaRecommender.memory_amount(v))
            if killed and rec.target("mem", None) is not None:
                decision = rec.target("mem", None)
    return alloc


@pytest.mark.parametrize("case", ["steps", "timestamps", "gaps-and-backwards", "limits-move", "long", "centuries"])
@pytest.mark.parametrize("resource", ["cpu", "mem"])
def test_vpa_policy_equals_the_recommender_fed_sample_by_sample(case, resource):
    """The replay answers CPU for every interval at once and skips memory intervals that change nothing but the
    last sample time: allocations (OOM kills included) equal feeding the recommender one sample at a time. (Steps of
    11 samples of 10 s: an interval's last sample lands on a 1200 s memory window's end.)"""
    rng = np.random.default_rng([len(case), len(resource)])
    n = 1500 if case == "long" else 400
    mem = np.abs(np.cumsum(rng.normal(3e6, 4e7, n))) + 5e8
    mem[rng.random(n) < 0.03] *= 1.6  # spikes: OOM kills at most percentiles
    usage = mem if resource == "mem" else rng.gamma(2.0, 1.5, n)
    usage[rng.random(n) < 0.04] = np.nan
    limit = np.full(n, 3e9 if resource == "mem" else 8.0)
    ts = None
    if case != "steps":
        ts = 1_700_000_000 + np.cumsum(rng.integers(5, 60, n)).astype(float)
    if case == "gaps-and-backwards":
        ts[rng.random(n) < 0.05] -= 300
        ts[rng.random(n) < 0.03] = np.nan
    if case == "limits-move":
        limit = limit * np.where(rng.random(n) < 0.1, 0.2, 1.0)
        limit[rng.random(n) < 0.02] = np.nan
    if case == "long":  # past 100 CPU half-lives and many memory windows
        ts = 1_700_000_000 + np.cumsum(rng.integers(200, 700, n)).astype(float)
    if case == "centuries":  # a first sample 300 years before the others: time differences beyond an int64 of ns
        ts = 1e10 + np.cumsum(rng.integers(5, 60, n)).astype(float)
        ts[0] = 0.0
    ooms = 0
    for q in (0.5, 0.9, 0.99):
        params = PoliciesConfig(interval_steps=11 if case == "steps" else 10, vpa_percentile=q, vpa_cpu_half_life_s=3600.0)
        got = allocate("vpa", usage, limit, params, resource=resource, ts_seconds=ts)
        want = _vpa_fed_sample_by_sample(usage, limit, params, resource, ts)
        np.testing.assert_array_equal(got, want, err_msg=f"{case} {resource} q={q}")
        ooms += int(np.sum(usage > got)) if resource == "mem" else 0
    assert resource == "cpu" or ooms > 0


def test_vpa_allocation_is_capped_and_the_capped_allocation_drives_ooms():
    usage = np.array([4e9] * 10 + [4.5e9] * 10)
    got = allocate("vpa", usage, 4.2e9, PoliciesConfig(interval_steps=10), resource="mem")
    np.testing.assert_array_equal(got, [4.2e9] * 20)  # the target (4.7e9) is above the limit


# ----------------------------------------------------------------------------------- OOM and throttling


def test_oom_kills_and_throttling_hand_made():
    # cpu: limit 4; interval 4. prev.step.max allocates 4 (limit), then 2 (the max of [1, 2, 1, 2])
    cpu = [1.0, 2.0, 1.0, 2.0, 3.0, 1.0, 2.5, None]
    mem = [10.0, 20.0, 10.0, 20.0, 30.0, 10.0, 25.0, 40.0]
    pdf = _container("a", "svc", cpu, 4.0, mem, 35.0)
    pdf["ts"] = [datetime(2024, 1, 1) + timedelta(seconds=s) for s in (0, 30, 60, 90, 120, 180, 200, 230)]
    out = replay_container(pdf, PoliciesConfig(interval_steps=4), None).set_index(["policy", "resource"])
    c = out.loc[("prev.step.max", "cpu")]
    # step 4: 3 > 2 for 60 s (until step 5), step 6: 2.5 > 2 for 30 s (until step 7)
    assert (c.throttled_steps, c.oom_kills) == (2, 0)
    assert c.throttled_core_seconds == pytest.approx(1.0 * 60 + 0.5 * 30)
    m = out.loc[("prev.step.max", "mem")]
    # mem allocation 35 (limit), then 20: step 4 (30) is an OOM kill, after which the pod restarts with the bump,
    # max(20, 30 + 100 MiB) capped at the limit 35, so step 6 (25) fits and step 7 (40 > 35, even for static) is
    # the second kill; steps 4 and 7 are unmet
    assert (m.oom_kills, m.met_steps, m.throttled_steps, m.throttled_core_seconds) == (2, 6, 0, 0.0)
    assert m.allocated == 4 * 35 + 20 + 3 * 35 and m.hours == pytest.approx(260 / 3600)
    assert out.loc[("static", "mem")].oom_kills == 1 and out.loc[("static", "cpu")].throttled_steps == 0
    assert (out.oom_kills[out.index.get_level_values("resource") == "cpu"] == 0).all()
    assert (out.throttled_steps[out.index.get_level_values("resource") == "mem"] == 0).all()
    # without timestamps a step lasts vpa_step_seconds
    bare = replay_container(pdf.drop(columns="ts"), PoliciesConfig(interval_steps=4, vpa_step_seconds=5.0), None)
    row = bare[(bare.policy == "prev.step.max") & (bare.resource == "cpu")].iloc[0]
    assert row.throttled_core_seconds == pytest.approx(1.5 * 5.0)


def test_an_oom_kill_is_an_event_the_policy_reacts_to():
    """Memory above the allocation kills the container once; the policy's reaction (the OOM bump, capped at the
    limit) holds for the rest of the interval; a container stuck above an allocation nothing can raise (its limit)
    is one kill, not one per step; the next interval is the policy's own rule again."""
    gb = 1e9
    mem = np.array([1.0, 1, 1, 1, 3, 3, 3.3, 4.5, 2, 2, 2, 2, 9, 9, 9, 1]) * gb
    params = PoliciesConfig(interval_steps=4)
    trace = Trace({}, None, None, np.full(16, 30.0), {"mem": mem}, {"mem": np.full(16, 8 * gb)})
    alloc, kills = allocations("prev.step.max", trace, "mem", params)
    bump = oom_bump(3 * gb)  # 3.6e9: 1.2 x 3 GB, more than 3 GB + 100 MiB
    assert bump == pytest.approx(3.6 * gb)
    # interval 1 decides 1 GB: step 4 (3 GB) is killed, then the bump holds 3 and 3.3 GB but not 4.5 GB: a second
    # kill, bumped to 5.4 GB; interval 2 decides 4.5 GB (the max of interval 1); interval 3 decides 2 GB: 9 GB is
    # above even the limit (8 GB), one kill for the three steps the pod cannot get past its limit
    np.testing.assert_allclose(alloc, [8 * gb] * 4 + [gb, bump, bump, bump, 4.5 * gb, 4.5 * gb, 4.5 * gb, 4.5 * gb,
                                                       2 * gb, 8 * gb, 8 * gb, 8 * gb])
    assert np.flatnonzero(kills).tolist() == [4, 7, 12, 13]
    # (step 12 is a kill at 2 GB; after it the limit 8 GB is in force and step 13 is a new kill at a new allocation;
    # steps 14 and 15 stay above the same allocation, or fit: no more kills)
    # static (the limit) is never raised: one kill for the whole excursion above it
    static, kills = allocations("static", trace, "mem", params)
    assert np.all(static == 8 * gb) and np.flatnonzero(kills).tolist() == [12]
    # CPU is throttled, never killed: no reaction
    cpu_trace = Trace({}, None, None, np.full(16, 30.0), {"cpu": mem / gb}, {"cpu": np.full(16, 8.0)})
    alloc, kills = allocations("prev.step.max", cpu_trace, "cpu", params)
    assert not kills.any() and np.all(alloc[4:8] == 1.0)


def test_step_durations_around_missing_timestamps():
    ts = np.array([0.0, 30.0, np.nan, 90.0, 120.0])
    np.testing.assert_allclose(step_durations(ts, 5, 10.0), [30.0, 30.0, 30.0, 30.0, 30.0])
    np.testing.assert_allclose(step_durations(np.array([5.0]), 1, 10.0), [10.0])


# --------------------------------------------------------------------------------------------- calibration


def test_every_knob_row_of_the_grid_is_a_replay_at_that_knob():
    """The grid shares work between knob values (VPA samples converted once, CPU fed once, the phase before each
    interval found once): each of its rows must still be what a replay at that one value gives, OOMs included."""
    rng = np.random.default_rng(7)
    n = 157
    mem = np.cumsum(rng.normal(2e7, 6e7, n)) + 1e9  # bytes: above VPA's 250 MiB minimum
    mem[rng.random(n) < 0.05] = np.nan
    cpu = rng.gamma(2.0, 1.5, n)
    cpu[rng.random(n) < 0.05] = np.nan
    phases = [None if rng.random() < 0.1 else int(p) for p in np.repeat(rng.integers(0, 3, n // 9 + 1), 9)[:n]]
    pdf = _container("a", "svc", list(cpu), 10.0, list(mem), 8e9, phases)
    stats = {0: {"cpu_fraction": 0.4, "mem_fraction": 0.5}, 1: {"cpu": 6.0, "mem": 2.6e9},
             2: {"cpu_fraction": 0.8, "mem_fraction": 0.9, "cpu_headroom": list(np.linspace(-0.1, 0.4, 201)),
                 "mem_headroom": list(np.linspace(-0.05, 0.2, 201))}}
    transitions = {(0, 1): 0.5, (1, 2): 0.7, (2, 0): 0.1, (0, 2): 0.3}
    grid = replay_container_grid(pdf, P4, stats, transitions)
    assert grid[(grid.policy == "vpa") & (grid.resource == "mem")].oom_kills.nunique() > 1  # the memory loop differs between percentiles
    for policy, (name, values) in KNOBS.items():
        for value in values:
            alone = replay_container(pdf, dataclasses.replace(P4, **{name: value}), stats, transitions)
            alone = alone[alone.policy == policy].set_index(["policy", "resource"])
            row = grid[(grid.policy == policy) & (grid.knob == value)].set_index(["policy", "resource"]).loc[alone.index]
            pd.testing.assert_frame_equal(row.drop(columns="knob"), alone, check_exact=True, obj=f"{policy} {name}={value}")


def test_knob_grid_rows_and_default_knob_rows():
    pdf = _container("a", "svc", list(USAGE8), 10.0, [100.0] * 8, 200.0, [None, 0, 0, 1, 1, 1, 0, 0])
    stats = {0: {"cpu": 3.0, "mem": 150.0}, 1: {"cpu": 6.0, "mem": 60.0}}
    transitions = {(0, 1): 1.0, (1, 0): 1.0}
    grid = replay_container_grid(pdf, P4, stats, transitions)
    assert list(grid.columns) == list(FRONTIER_COLUMNS) == [f.name for f in POLICY_FRONTIER.fields]
    per_policy = grid.groupby("policy").size()
    for policy in POLICIES:
        assert per_policy[policy] == 2 * (len(KNOBS[policy][1]) if policy in KNOBS else 1), policy
    assert grid[~grid.policy.isin(list(KNOBS))].knob.isna().all()
    # the row of each policy at P4's own knob value is replay_container's row
    base = replay_container(pdf, P4, stats, transitions).set_index(["policy", "resource"])
    for policy, (name, values) in KNOBS.items():
        value = getattr(P4, name)
        if value in values:
            row = grid[(grid.policy == policy) & (grid.knob == value)].set_index(["policy", "resource"])
            pd.testing.assert_frame_equal(row.drop(columns="knob"), base.loc[row.index], check_dtype=False)
    # a custom grid, and a policy without a knob refused
    small = replay_container_grid(pdf, P4, stats, transitions, knobs={"vpa": [0.5, 0.99]})
    assert sorted(small[small.policy == "vpa"].knob.unique()) == [0.5, 0.99]
    with pytest.raises(InputError, match="no knob"):
        replay_container_grid(pdf, P4, knobs={"static": [1.0]})


def _frontier_row(pod, policy, knob, steps, met, allocated, resource="cpu"):
    return {"pod_id": pod, "policy": policy, "resource": resource, "knob": knob, "steps": steps, "hours": steps / 120,
            "met_steps": met, "allocated": allocated, "oom_kills": 0}


def test_choose_knob_two_containers():
    rows = []
    # prev.step.rules over two containers: k=1 -> 15/20 met, k=2 -> 19/20, k=3 -> 20/20
    for k, met, alloc in [(1.0, (7, 8), (50, 40)), (2.0, (9, 10), (60, 45)), (3.0, (10, 10), (80, 50))]:
        rows += [_frontier_row(pod, "prev.step.rules", k, 10, m, a) for pod, m, a in zip("ab", met, alloc)]
    # vpa never reaches 95 %: the most generous knob (highest fulfilment, then the cheaper one) is flagged
    for q, met, alloc in [(0.5, 12, 70), (0.9, 18, 90), (0.99, 18, 95)]:
        rows += [_frontier_row("a", "vpa", q, 10, met // 2, alloc / 2), _frontier_row("b", "vpa", q, 10, met - met // 2, alloc / 2)]
    rows += [_frontier_row(p, "static", np.nan, 10, 10, 100) for p in ("a", "b")]
    rows += [_frontier_row(p, "static", np.nan, 5, 5, 20, "mem") for p in ("a", "b")]
    got = choose_knob(pd.DataFrame(rows), 0.95).set_index(["resource", "policy"])
    assert list(got.index) == [("cpu", "static"), ("cpu", "prev.step.rules"), ("cpu", "vpa"), ("mem", "static")]
    r = got.loc[("cpu", "prev.step.rules")]
    assert (r.knob, r.knob_name, r.steps, r.met_steps, r.allocated, r.reached) == (2.0, "k_std", 20, 19, 105, True)
    assert r.fulfilment == pytest.approx(0.95)
    v = got.loc[("cpu", "vpa")]
    assert (v.knob, v.knob_name, v.allocated, v.reached) == (0.9, "vpa_percentile", 90, False)
    s = got.loc[("cpu", "static")]
    assert np.isnan(s.knob) and s.knob_name is None and s.reached and s.allocated == 200
    assert choose_knob(pd.DataFrame(rows), 1.0).set_index(["resource", "policy"]).loc[("cpu", "prev.step.rules")].knob == 3.0
    with pytest.raises(InputError):
        choose_knob(pd.DataFrame(rows), 1.5)
    with pytest.raises(InputError, match="lacks"):
        choose_knob(pd.DataFrame(rows).drop(columns="met_steps"), 0.9)


def test_choose_knob_per_resource_targets_and_an_oom_budget():
    def mem_row(pod, margin, met, alloc, kills):  # 10 memory steps of 30 s: 1/12 of a container-hour
        return {**_frontier_row(pod, "phase.rule", margin, 10, met, alloc, "mem"), "oom_kills": kills}

    rows = [mem_row(p, m, met, a, k) for m, met, a, k in [(0.0, 8, 40, 2), (0.5, 9, 50, 1), (1.0, 10, 60, 0)] for p in "abcd"]
    rows += [_frontier_row(p, "phase.rule", m, 10, met, a) for m, met, a in [(0.0, 8, 4), (0.5, 10, 5)] for p in "abcd"]
    frame = pd.DataFrame(rows)
    # per resource: cpu at 80 % takes the cheapest margin, memory at 90 % the middle one
    got = choose_knob(frame, ServiceLevel(cpu_fulfilment=0.8, mem_fulfilment=0.9)).set_index("resource")
    assert (got.loc["cpu", "knob"], got.loc["mem", "knob"]) == (0.0, 0.5)
    # an OOM budget in kills per 100 container-hours: 4 containers of 1/12 h, one kill each at margin 0.5, is
    # 1200 per 100 h; a budget of 1200 takes margin 0.5, one of 500 needs margin 1.0
    assert choose_knob(frame, ServiceLevel(0.95, oom_kills_per_100h=1200)).set_index("resource").loc["mem", "knob"] == 0.5
    strict = choose_knob(frame, ServiceLevel(0.95, oom_kills_per_100h=500)).set_index("resource").loc["mem"]
    assert strict.knob == 1.0 and strict.reached and strict.oom_kills_per_100h == 0.0
    totals = frame.groupby(["policy", "resource", "knob"], as_index=False)[["steps", "hours", "met_steps", "allocated", "oom_kills"]].sum()
    totals = totals.assign(containers=4, static_allocated=100.0, throttled_steps=0, throttled_core_seconds=0.0)
    assert choose_knob(totals, ServiceLevel(0.95, oom_kills_per_100h=1200)).set_index("resource").loc["mem", "knob"] == 0.5
    # a budget no knob meets: the fewest kills, flagged
    none = choose_knob(frame[frame.knob < 1.0], ServiceLevel(0.95, oom_kills_per_100h=500)).set_index("resource").loc["mem"]
    assert none.knob == 0.5 and not none.reached
    # the calibration table says which target each resource was held to, with units
    table = calibrate(totals, totals, ServiceLevel(0.95, oom_kills_per_100h=1200)).set_index("resource")
    assert table.loc["mem", "oom_budget_per_100h"] == 1200 and np.isnan(table.loc["mem", "target_fulfilment"])
    assert table.loc["mem", "oom_kills_per_100h"] == pytest.approx(1200.0) and table.loc["mem", "hours"] == pytest.approx(1 / 3)
    assert table.loc["cpu", "target_fulfilment"] == 0.95 and np.isnan(table.loc["cpu", "oom_budget_per_100h"])
    text = format_comparison(table.reset_index())
    assert "mem <= 1200 OOM kills per 100 container-hours" in text and "OOM kills/100 h" in text
    assert "throttled core-s" in text
    with pytest.raises(InputError, match="hours"):
        choose_knob(totals.drop(columns="hours"), ServiceLevel(0.95, oom_kills_per_100h=1))
    with pytest.raises(InputError):
        ServiceLevel(0.95, mem_fulfilment=1.5)
    with pytest.raises(InputError, match="exactly one"):
        ServiceLevel(0.95, mem_fulfilment=0.9, oom_kills_per_100h=1.0)


def test_service_level_from_config():
    from ai4dl.config import load_config

    default = ServiceLevel.from_config(load_config().policies)  # CPU steps met, memory an OOM budget
    assert default.by_oom("mem") and not default.by_oom("cpu") and default.cpu_fulfilment == 0.95
    cfg = load_config(None, ["policies.target_fulfilment=0.9", "policies.target_fulfilment_mem=0.99"])
    level = ServiceLevel.from_config(cfg.policies)
    assert (level.cpu_fulfilment, level.mem_fulfilment, level.oom_kills_per_100h) == (0.9, 0.99, None)
    budget = ServiceLevel.from_config(load_config(None, ["policies.oom_budget_per_100h=20"]).policies)
    assert budget.describe("mem") == "<= 20 OOM kills per 100 container-hours" and budget.describe("cpu") == "95% of steps met"
    shares = ServiceLevel.from_config(load_config(None, ["policies.oom_budget_per_100h=null"]).policies)
    assert shares.describe("mem") == "95% of steps met"


# ------------------------------------------------------------------------------------- proactive phase policy


def test_phase_proactive_hand_computed():
    usage = np.ones(16)
    phases = [0] * 4 + [1] * 4 + [2] * 4 + [0] * 4
    stats = {0: {"cpu": 1.0}, 1: {"cpu": 4.0}, 2: {"cpu_fraction": 0.5}}
    transitions = {(0, 1): 0.7, (0, 2): 0.1, (1, 2): 0.25, (1, 0): 0.75, (2, 0): 1.0}
    p = PoliciesConfig(interval_steps=4, margin=0.1, proactive_threshold=0.2)
    got = allocate("phase.proactive", usage, 10.0, p, phases, stats, "cpu", transitions=transitions)
    # interval 1: phase 0 and its likely successor 1 (0.7; 2 at 0.1 is not likely) -> 4 * 1.1; interval 2: phase 1
    # with successors 2 (0.25: 0.5 of the limit = 5) and 0 -> 5 * 1.1; interval 3: phase 2 and 0 -> 5 * 1.1
    np.testing.assert_allclose(got, [10] * 4 + [4.4] * 4 + [5.5] * 4 + [5.5] * 4)
    # phase.rule is the same policy without the successors; so is phase.proactive without transitions
    rule = allocate("phase.rule", usage, 10.0, p, phases, stats, "cpu")
    np.testing.assert_allclose(rule, [10] * 4 + [1.1] * 4 + [4.4] * 4 + [5.5] * 4)
    np.testing.assert_allclose(allocate("phase.proactive", usage, 10.0, p, phases, stats, "cpu"), rule)
    # a likely successor without a statistic: the limit; the gold table as a DataFrame works as the mapping
    table = pd.DataFrame({"src": [0, 0], "dst": [1, 3], "probability": [0.5, 0.5], "count": [1, 1]})
    np.testing.assert_allclose(allocate("phase.proactive", usage, 10.0, p, phases, stats, "cpu", transitions=table)[4:8], 10.0)


def test_phase_proactive_beats_reactive_when_phases_change_at_boundaries():
    # a low phase (1 core, 1 GB) for three intervals, then a high one (6 cores, 6 GB) for one, four times over
    low, high, gb = [0] * 12, [1] * 4, 1e9
    phases = (low + high) * 4
    cpu = [1.0 if p == 0 else 6.0 for p in phases]
    pdf = _container("a", "svc", cpu, 8.0, [c * gb for c in cpu], 8 * gb, phases)
    stats = {0: {"cpu": 1.0, "mem": gb}, 1: {"cpu": 6.0, "mem": 6 * gb}}
    transitions = {(0, 1): 1.0, (1, 0): 1.0}
    p = PoliciesConfig(interval_steps=4, margin=0.0)
    out = replay_container(pdf, p, stats, transitions).set_index(["policy", "resource"])
    pro, rules, rule = (out.loc[(name, "mem")] for name in ("phase.proactive", "prev.step.rules", "phase.rule"))
    # the reactive policies are OOM-killed by every high interval (the change lands at an interval start), once:
    # the pod restarts with the bump (1.2 x 6 GB) for the rest of the interval
    assert pro.oom_kills == 0 and rules.oom_kills == 4 and rule.oom_kills == 4
    assert rules.met_steps == 60 and rules.allocated > 12 * 4 * gb
    assert out.loc[("phase.proactive", "cpu")].throttled_steps == 0 < out.loc[("prev.step.rules", "cpu")].throttled_steps
    # at a matched service level (every step met) proactive gets there with its cheapest margin, while no k of
    # prev.step.rules does (a constant low interval has no spread to scale up)
    frontier = replay_container_grid(pdf, p, stats, transitions)
    chosen = choose_knob(frontier, 1.0).set_index(["resource", "policy"])
    for resource in ("cpu", "mem"):
        assert chosen.loc[(resource, "phase.proactive")].reached and chosen.loc[(resource, "phase.proactive")].knob == 0.0
        assert not chosen.loc[(resource, "prev.step.rules")].reached
    assert chosen.loc[("cpu", "prev.step.rules")].fulfilment == 0.75  # every high step throttled
    assert chosen.loc[("mem", "prev.step.rules")].fulfilment == 60 / 64  # one killed step per high interval
    # and the transitions predict every phase change of this trace
    assert next_phase_f1(phases, transitions) == {"boundaries": 7, "predicted": 7, "correct": 7, "precision": 1.0,
                                                  "recall": 1.0, "f1": 1.0}


# ------------------------------------------------------------------------- phase policy with learned headroom


def _levels(value_at_zero: float, value_at_one: float) -> list[float]:
    """A quantile table rising linearly from one value at level 0 to another at level 1."""
    return [value_at_zero + (value_at_one - value_at_zero) * q for q in HEADROOM_LEVELS]


def test_phase_headroom_hand_computed():
    usage = np.array([1.0, 2, 3, 4, 2, 2, 2, 2, 6, 5, 4, 3, 1, 1, 1, 1])
    phases = [None] * 4 + [0] * 4 + [1] * 4 + [2] * 4
    stats = {0: {"cpu_headroom": _levels(0.0, 0.4)}, 1: {"cpu_headroom": _levels(-0.2, 0.0)}}
    p = PoliciesConfig(interval_steps=4, headroom_quantile=0.5)
    got = allocate("phase.headroom", usage, 10.0, p, phases, stats, "cpu")
    # interval 1: no phase before it -> limit; 2: max 2 + 0.2 * 10 (phase 0 at the median); 3: max 6 - 0.1 * 10
    np.testing.assert_allclose(got, [10] * 4 + [10] * 4 + [4] * 4 + [5] * 4)
    # the knob reads the table by interpolation; a phase without a table (2) gets the limit
    higher = allocate("phase.headroom", usage, 10.0, dataclasses.replace(p, headroom_quantile=1.0), phases, stats, "cpu")
    np.testing.assert_allclose(higher[8:], [6] * 4 + [6] * 4)
    later = np.array([None] * 4 + [0] * 4 + [1] * 4 + [2] * 4 + [2] * 4, dtype=object)
    np.testing.assert_allclose(allocate("phase.headroom", np.ones(20), 10.0, p, later, stats, "cpu")[16:], 10.0)


def test_headroom_tables_from_jumps_of_a_trace():
    usage = np.array([1.0, 2, 5, 5, 4, 3, 3, 3])
    phases = np.array([0, 0, 1, 1, 1, 1, 0, None], dtype=object)
    ph, jump = jumps_of(usage, np.full(8, 10.0), phases, 2)
    # interval maxima 2, 5, 4, 3; phases before intervals 1..3: 0 (step 1), 1 (step 3), 1 (step 5)
    np.testing.assert_allclose(ph, [0, 1, 1])
    np.testing.assert_allclose(jump, [0.3, -0.1, -0.1])
    tables = headroom_tables(ph, jump)
    assert set(tables) == {0, 1} and len(tables[0]) == len(HEADROOM_LEVELS)
    np.testing.assert_allclose(tables[1], -0.1)
    # the per-container frame is the same rule over replay_frame, for both resources
    pdf = _container("a", "svc", list(usage), 10.0, list(usage * 1e9), 1e10, list(phases))
    frame = container_jumps(pdf, PoliciesConfig(interval_steps=2))
    assert list(frame.columns) == ["phase", "resource", "jump"]
    np.testing.assert_allclose(frame[frame.resource == "mem"].jump, [0.3, -0.1, -0.1])


def test_phase_headroom_stats_in_spark_equal_the_pandas_tables(spark):
    from ai4dl.policies.fleet import phase_headroom_stats

    p = PoliciesConfig(interval_steps=2)
    a = _container("a", "s", [1.0, 2, 5, 5, 4, 3, 3, 3], 10.0, [1e9, 2e9, 5e9, 5e9, 4e9, 3e9, 3e9, 3e9], 1e10,
                   [0, 0, 1, 1, 1, 1, 0, None])
    b = _container("b", "s", [2.0, 2, 2, 2, 8, 8], 20.0, [1e9] * 6, 1e10, [0, 0, 0, 0, 1, 1])
    got = phase_headroom_stats(_spark_df(spark, [a, b]), p)
    frames = pd.concat([container_jumps(a, p), container_jumps(b, p)])
    for resource in ("cpu", "mem"):
        part = frames[frames.resource == resource]
        want = headroom_tables(part.phase.to_numpy(), part.jump.to_numpy())
        assert set(got) == set(want)
        for phase, table in want.items():
            # approximate percentiles return observed jumps: exact at the ends, within the jumps in between
            spark_table = got[phase][f"{resource}_headroom"]
            assert spark_table[0] == pytest.approx(table[0]) and spark_table[-1] == pytest.approx(table[-1])
            assert spark_table == sorted(spark_table)


def test_phase_jumps_in_spark_equal_container_jumps(spark):
    """Spark's aggregations give every container's jumps to the bit: gaps in the steps and a first step other than
    0 (intervals aligned at it), unlabelled steps, unknown usage and limits as null or NaN, a limit unknown at an
    interval's first step (filled forward, or backward at the container's start), zero limits, limits that
    change, a one-step container."""
    from ai4dl.lake.schema import PHASES
    from ai4dl.policies.fleet import phase_jumps

    rng = np.random.default_rng(11)
    p = PoliciesConfig(interval_steps=3)
    start = datetime(2024, 1, 1)
    rows, want = [], []
    for c in range(8):
        n = 1 if c == 7 else int(rng.integers(20, 80))
        steps = np.sort(rng.choice(np.arange(n + 20), n, replace=False)) + 5 * c
        cpu, mem = rng.gamma(2.0, 1.0, n), rng.gamma(2.0, 1e9, n)
        cpu_lim = rng.choice([4.0, 8.0, 16.0], n)  # limits that change, so a wrong fill shows
        mem_lim = rng.choice([1e10, 2e10, 3e10], n)
        for arr in (cpu, mem, cpu_lim, mem_lim):
            arr[rng.random(n) < 0.15] = np.nan
        cpu_lim[:5] = np.nan
        mem_lim[rng.random(n) < 0.05] = 0.0
        phases = [None if rng.random() < 0.25 else int(rng.integers(0, 3)) for _ in range(n)]
        pdf = pd.DataFrame({"pod_id": f"p{c}", "service": "s", "ts": [start + timedelta(seconds=30 * int(k)) for k in steps],
                            "step": steps.astype("int32"), "phase": phases, "cpu_usage_cores": cpu, "cpu_num_cores": cpu_lim,
                            "mem_current": mem, "mem_limit": mem_lim})
        want += [tuple(r) for r in container_jumps(pdf, p).itertuples(index=False)]

        def unknown(v):  # null or NaN, both "unknown" to the replay
            return (None if rng.random() < 0.5 else math.nan) if math.isnan(v) else float(v)

        for r, phase in zip(pdf.itertuples(index=False), phases):
            rows.append((r.pod_id, r.service, r.ts.to_pydatetime(), int(r.step), phase, None, None,
                         unknown(r.cpu_usage_cores), unknown(r.cpu_num_cores), unknown(r.mem_current),
                         unknown(r.mem_limit), None, "m1"))
    got = [tuple(r) for r in phase_jumps(spark.createDataFrame(rows, PHASES), p.interval_steps).collect()]
    assert len(want) > 100 and {r[1] for r in want} == {"cpu", "mem"}
    assert sorted(got) == sorted(want)


def test_phase_headroom_learns_a_ramp_the_reactive_rule_misses():
    # phase 0 is steady at 1 core; phase 1 ramps up by 1 core per step: the reactive rule is always one
    # interval behind a ramp, the headroom learned for phase 1 (the ramp's jump per interval) is not
    steady, ramp = [1.0] * 8, [1.0 + i for i in range(8)]
    usage = np.array(steady + ramp + steady + ramp)
    phases = np.array([0] * 8 + [1] * 8 + [0] * 8 + [1] * 8, dtype=object)
    p = PoliciesConfig(interval_steps=4)
    ph, jump = jumps_of(usage, np.full(len(usage), 10.0), phases, 4)
    stats = {int(k): {"cpu_headroom": v} for k, v in headroom_tables(ph, jump).items()}
    pdf = _container("a", "svc", list(usage), 10.0, list(usage * 1e9), 1e10, list(phases))
    frontier = replay_container_grid(pdf, p, stats)
    chosen = choose_knob(frontier[frontier.resource == "cpu"], 0.9).set_index("policy")
    head, rules, prev_max = (chosen.loc[name] for name in ("phase.headroom", "prev.step.rules", "prev.step.max"))
    # no spread multiple of the previous interval and no margin on its max (up to +100 %) keeps up with the ramp
    assert head.reached and not rules.reached and not prev_max.reached
    assert head.fulfilment > max(rules.fulfilment, prev_max.fulfilment)


def test_next_phase_f1_counts():
    got = next_phase_f1([1, 1, 2, 2, 3, np.nan, 3, 1], {(1, 2): 0.4, (1, 3): 0.6, (2, 3): 1.0, (3, 3): 0.9, (3, 1): 0.1})
    # runs 1, 2, 3, 1: 1 -> 3 predicted (wrong), 2 -> 3 right, 3 -> 1 right (the self-transition is no change)
    assert (got["boundaries"], got["predicted"], got["correct"]) == (3, 3, 2)
    assert got["f1"] == pytest.approx(2 / 3)
    none = next_phase_f1([4, 4, 5], {})
    assert (none["boundaries"], none["predicted"], none["correct"]) == (1, 0, 0)
    assert np.isnan(none["precision"]) and none["recall"] == 0.0 and np.isnan(none["f1"])
    assert next_phase_f1([None, None], {})["boundaries"] == 0


def test_next_phase_reads_the_services_own_cycle_beside_the_fleets():
    from ai4dl.policies.nextphase import SERVICE_PRIOR, fleet_next_phase_f1, next_phase_table, normalise_service_transitions

    # the fleet leaves 1 for 2 mostly; service "b" runs its own loop 1 -> 3 -> 1
    fleet = {(1, 2): 0.8, (1, 3): 0.2, (2, 1): 1.0, (3, 1): 1.0}
    counts = normalise_service_transitions(pd.DataFrame({"service": ["b", "b", "a", None, np.nan], "src": [1, 3, 1, 1, 1],
                                                         "dst": [3, 1, 2, 3, 3], "count": [6, 6, 1, 9, 9]}))
    assert counts == {"b": {1: {3: 6}, 3: {1: 6}}, "a": {1: {2: 1}}}  # no service: not a service's habit
    loop = [1, 3, 1, 3, 1]
    assert next_phase_f1(loop, fleet)["correct"] == 2  # the fleet's table says 2 after 1
    assert next_phase_f1(loop, fleet, counts["b"])["correct"] == 4
    # a service seen leaving 1 once is shrunk towards the fleet: (1 + 3 x 0.2) / (1 + 3) for 3 is below 2's
    assert next_phase_table(fleet, {1: {3: 1}})[1] == (2, pytest.approx(SERVICE_PRIOR * 0.8 / (1 + SERVICE_PRIOR)))
    assert next_phase_table(fleet, counts["b"])[1] == (3, pytest.approx((6 + SERVICE_PRIOR * 0.2) / (6 + SERVICE_PRIOR)))
    runs = pd.DataFrame({"pod_id": ["p"] * 5 + ["q"] * 5, "service": ["b"] * 5 + ["new"] * 5, "run": list(range(5)) * 2,
                         "phase": loop * 2})
    scores = fleet_next_phase_f1(runs, fleet, counts)
    assert (scores["boundaries"], scores["correct"]) == (8, 4 + 2)  # an unseen service reads the fleet's table
    assert fleet_next_phase_f1(runs, fleet)["correct"] == 2 + 2
    with pytest.raises(InputError, match="lack column 'service'"):
        fleet_next_phase_f1(runs.drop(columns="service"), fleet, counts)
    # one pod id in two services is two containers, each told its own service's table
    twice = runs.assign(pod_id="p")
    assert fleet_next_phase_f1(twice, fleet, counts)["correct"] == 4 + 2
    # a phase only the service was seen leaving: its own counts alone (no fleet prior to add)
    assert next_phase_table({}, {5: {6: 2, 7: 2}}) == {5: (6, 1 / 2)}  # ties: the smallest phase
    # ties between phases once the counts are added: the smallest
    assert next_phase_table({(1, 2): 0.5, (1, 3): 0.5}, {1: {2: 1, 3: 1}})[1][0] == 2


def test_calibration_chooses_knobs_on_training_containers_only(spark, cfg):
    """Training containers swing (prev.step.rules needs a large k to meet 95 %), held-out ones are flat (any k
    meets it): the calibrated k must be the training containers' — it would be the smallest if they leaked."""
    from pyspark.sql import functions as F

    from ai4dl import stages
    from ai4dl.lake.tables import Lake

    split = ContainerSplit.of(cfg.window)
    ids = spark.createDataFrame([(f"pod-{i}",) for i in range(40)], "pod_id string")
    train_ids = [r[0] for r in split.training(ids).collect()][:3]
    held_ids = [r[0] for r in split.held_out(ids).collect()][:3]
    rng = np.random.default_rng(0)
    pdfs = []
    for pod in train_ids:
        swing = 50.0 + 40.0 * rng.standard_normal(200).clip(-1.2, 1.2)  # memory jumps around within each interval
        pdfs.append(_container(pod, "svc", np.full(200, 1.0), 4.0, swing, 1000.0, [0] * 200))
    for pod in held_ids:
        pdfs.append(_container(pod, "svc", np.full(200, 1.0), 4.0, np.full(200, 50.0), 1000.0, [0] * 200))
    lake = Lake.for_config(spark, cfg)
    lake.overwrite("phases", _spark_df(spark, pdfs).withColumn("model_id", F.lit("m")))
    table = stages.policies(cfg, spark).details["calibration"].set_index(["policy", "resource"])
    chosen = table.loc[("prev.step.rules", "mem")]
    assert chosen["reached"] and chosen["knob"] >= 1.0  # flat held-out memory would have taken k = 0
    assert chosen["containers"] == len(held_ids) and chosen["fulfilment"] == 1.0  # scored held out
    assert set(lake.read("policy_frontier").select("pod_id").distinct().toPandas()["pod_id"]) == set(held_ids)


def test_calibration_replays_a_fixed_subset_of_training_containers_on_a_large_fleet(spark, cfg):
    """Above policies.calibration_containers training containers, the knob grid is replayed on a hash-chosen
    subset of about that many: training ones only, the same on every run, all of them on a small fleet, and none
    the forecasters were fitted on while there are enough others (a forecaster's margin is calibrated only on
    containers its trees never saw: a subset inside their fit sample left the forecast policies out of the
    calibration altogether, as on the 10M-row bench fleet)."""
    from ai4dl.policies.model import PolicyEstimator

    ids = spark.createDataFrame([(f"pod-{i}",) for i in range(1000)], "pod_id string")
    split = ContainerSplit.of(cfg.window)
    train = split.training(ids)
    everyone = {r[0] for r in train.collect()}
    estimator = PolicyEstimator(cfg.policies, split)
    assert estimator.calibration_containers(train) == (train, None)  # default 1000: more than the 80 % of 1000
    capped = PolicyEstimator(cfg.replace(policies={"calibration_containers": 400}).policies, split)
    subset, n = capped.calibration_containers(train)
    chosen = {r[0] for r in subset.collect()}
    assert n == len(everyone) and chosen < everyone and 300 <= len(chosen) <= 500
    assert {r[0] for r in capped.calibration_containers(train)[0].collect()} == chosen
    smaller = {r[0] for r in ContainerSplit.of(cfg.window).training_sample(train, 0.1, from_end=True).collect()}
    assert smaller < chosen  # a smaller share is a subset of a larger one
    fit_share = cfg.policies.forecast_fit_share
    assert 400 / len(everyone) <= 1 - fit_share  # so the two samples can be kept apart
    fitted = {r[0] for r in split.training_sample(train, fit_share).collect()}
    assert fitted and not fitted & chosen
    with pytest.raises(ConfigError):
        cfg.replace(policies={"calibration_containers": 0})


def test_policy_transitions_read_the_sequences_behaviour_built_from_the_same_phases(spark, cfg, monkeypatch):
    """behaviour's sequences hold every container's runs: the policy model's training transitions are counted from
    them when they were built from the newest phases commit with the configured smoothing, and the runs are
    computed again when the phases changed since (or the smoothing differs)."""
    from pyspark.sql import functions as F

    from ai4dl import stages
    from ai4dl.behaviour import sequences as B
    from ai4dl.lake.tables import Lake

    ids = spark.createDataFrame([(f"pod-{i}",) for i in range(40)], "pod_id string")
    train = [r[0] for r in ContainerSplit.of(cfg.window).training(ids).collect()][:2]
    held = ContainerSplit.of(cfg.window).held_out(ids).first()[0]
    lake = Lake.for_config(spark, cfg)

    def write_phases(pattern):
        pdfs = [_container(p, "svc", np.full(40, 1.0), 4.0, np.full(40, 50.0), 1000.0, pattern) for p in [*train, held]]
        lake.overwrite("phases", _spark_df(spark, pdfs).withColumn("model_id", F.lit("m")))

    computed = []
    real = B.run_lengths
    monkeypatch.setattr(B, "run_lengths", lambda df, n=1: computed.append(1) or real(df, n))
    write_phases([0] * 20 + [1] * 20)
    stages.behaviour(cfg, spark)
    assert len(computed) == 1  # behaviour's own
    model = stages.policies(cfg, spark).details["model"]
    assert len(computed) == 1 and model.transitions == {0: {1: 1.0}}
    write_phases([2] * 20 + [1] * 20)  # relabelled after behaviour ran: its sequences are stale
    model = stages.policies(cfg, spark).details["model"]
    assert len(computed) == 2 and model.transitions == {2: {1: 1.0}}
    stages.behaviour(cfg, spark)
    other = cfg.replace(behaviour={"min_run_steps": cfg.behaviour.min_run_steps + 1})
    stages.policies(other, spark)
    assert len(computed) == 4  # behaviour's, then the policies' own for a smoothing the sequences were not built with

"""Live equals evaluated: what the deployed policies allocate live, step by step from running summaries, is the
replay's allocation at that step, for every policy family; and a container's live state stays the same size
however long it runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from ai4dl.config import LIVE_POLICIES, PoliciesConfig
from ai4dl.policies.forecast import Forecaster, trace_inputs
from ai4dl.policies.live import Deployment, LivePolicies
from ai4dl.policies.replay import Trace, allocations
from ai4dl.policies.rules import HEADROOM_LEVELS, KNOBS

GB = 1e9
STATS = {
    0: {"cpu_fraction": 0.3, "mem_fraction": 0.35, "cpu_headroom": list(np.linspace(-0.2, 0.3, 201)),
        "mem_headroom": list(np.linspace(-0.1, 0.05, 201))},
    1: {"cpu_fraction": 0.6, "mem_fraction": 0.5, "cpu_headroom": list(np.linspace(-0.1, 0.5, 201)),
        "mem_headroom": list(np.linspace(0.0, 0.2, 201))},
    2: {"cpu_fraction": 0.2, "mem_fraction": 0.7},  # no headroom table: phase.headroom allocates the limit
}
TRANSITIONS = {0: {1: 0.6, 2: 0.4}, 1: {0: 0.5, 2: 0.5}, 2: {0: 1.0}}
assert len(HEADROOM_LEVELS) == 201


def _trace(seed: int, n: int) -> pd.DataFrame:
    """A container that steps between phases and levels, with memory ramps and jumps that outgrow allocations
    (OOM kills for every family) and irregular sample times."""
    rng = np.random.default_rng(seed)
    ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.cumsum(rng.integers(10, 60, n)), unit="s")
    phase = np.repeat(rng.integers(0, 3, n // 15 + 1), 15)[:n].astype(float)
    phase[:3] = np.nan
    phase[rng.random(n) < 0.05] = np.nan  # unlabelled steps inside the trace
    mem = np.clip(2 * GB + np.cumsum(rng.normal(3e7, 2e8, n)), 0.3 * GB, 7.9 * GB)
    mem[rng.random(n) < 0.03] *= 1.8  # jumps: kills even for generous allocations
    cpu = np.abs(rng.normal(1.5, 0.9, n))
    return pd.DataFrame({"pod_id": f"p{seed}", "service": "s", "ts": ts, "step": np.arange(n), "phase": phase,
                         "cpu_usage_cores": cpu, "cpu_num_cores": 4.0, "mem_current": np.minimum(mem, 8 * GB),
                         "mem_limit": 8 * GB})


_FORECASTERS: dict = {}


def _forecasters() -> dict:
    """``forecast`` and ``phase.forecast`` fitted on other containers of the same kind (interval 7)."""
    if not _FORECASTERS:
        for resource in ("cpu", "mem"):
            parts = [trace_inputs(t.usage[resource], t.limit[resource], t.phases, 7, (0, 1, 2))
                     for t in (Trace.of(_trace(seed, 460), PoliciesConfig(interval_steps=7)) for seed in range(10, 16))]
            x, y = np.vstack([p.x for p in parts]), np.concatenate([p.target for p in parts])
            _FORECASTERS.setdefault("forecast", {})[resource] = Forecaster.fit(x[:, :12], y, 0.9)
            _FORECASTERS.setdefault("phase.forecast", {})[resource] = Forecaster.fit(x, y, 0.9, (0, 1, 2))
    return _FORECASTERS


def _live(deployment: Deployment, pdf: pd.DataFrame, every: int | None = None):
    """Feed ``pdf`` step by step, the state written and read back every ``every`` steps (a micro-batch boundary or
    a restart); yields the allocation for the next step after each."""
    live = LivePolicies(deployment)
    secs = ((pdf["ts"] - pd.Timestamp(0)) / pd.Timedelta(seconds=1)).to_numpy()
    for t, row in enumerate(pdf.itertuples(index=False)):
        if every and t % every == 0:
            live = LivePolicies.loads(deployment, live.dumps())
        phase = None if np.isnan(row.phase) else row.phase
        live.observe(secs[t], {"cpu": row.cpu_usage_cores, "mem": row.mem_current},
                     {"cpu": row.cpu_num_cores, "mem": row.mem_limit}, phase)
        yield live


@pytest.mark.parametrize("policy", LIVE_POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_live_allocation_equals_the_replays_for_every_policy(policy, seed):
    """Two knob values per family, one container per seed, state round-trips at uneven batch boundaries: every
    next-step allocation equals the replay of the whole trace at that step, to the bit (memory with its OOM
    reactions, VPA with its recommender's own histograms)."""
    pdf = _trace(seed, 460)
    kills = 0
    for knob_value in (KNOBS[policy][1][1], KNOBS[policy][1][-2]) if policy in KNOBS else (None,):
        params = PoliciesConfig(interval_steps=7)
        if knob_value is not None:
            params = dataclasses.replace(params, **{KNOBS[policy][0]: knob_value})
        trace = Trace.of(pdf, params)
        want = {}
        for r in ("cpu", "mem"):
            want[r], killed = allocations(policy, trace, r, params, STATS, TRANSITIONS, _forecasters())
            kills += int(killed.sum()) if r == "mem" else 0
        deployment = Deployment({"cpu": policy, "mem": policy}, {"cpu": params, "mem": params}, STATS, TRANSITIONS, "m",
                                _forecasters())
        for t, live in enumerate(_live(deployment, pdf, every=5 + seed)):
            if t + 1 == len(pdf):
                break
            nxt = live.next_allocation()
            assert nxt["step"] == t + 1 and nxt["interval"] == (t + 1) // 7
            for r in ("cpu", "mem"):
                assert nxt[r] == want[r][t + 1], (policy, knob_value, r, t + 1)
    assert policy == "static" or kills > 0  # the traces exercise the OOM reactions


def test_each_resource_deploys_its_own_policy_and_knob():
    pdf = _trace(3, 200)
    cpu_params = PoliciesConfig(interval_steps=10, k_std=1.5)
    mem_params = PoliciesConfig(interval_steps=10, vpa_percentile=0.95)
    deployment = Deployment({"cpu": "prev.step.rules", "mem": "vpa"}, {"cpu": cpu_params, "mem": mem_params}, STATS,
                            TRANSITIONS)
    trace = Trace.of(pdf, cpu_params)
    want_cpu = allocations("prev.step.rules", trace, "cpu", cpu_params)[0]
    want_mem = allocations("vpa", trace, "mem", mem_params)[0]
    for t, live in enumerate(_live(deployment, pdf, every=13)):
        if t + 1 < len(pdf):
            nxt = live.next_allocation()
            assert (nxt["cpu"], nxt["mem"]) == (want_cpu[t + 1], want_mem[t + 1])
    with pytest.raises(Exception, match="interval_steps"):
        Deployment({"cpu": "static", "mem": "static"}, {"cpu": cpu_params, "mem": PoliciesConfig(interval_steps=3)}, {}, {})
    with pytest.raises(Exception, match="live policy"):
        Deployment({"cpu": "current.step.max", "mem": "static"}, {"cpu": cpu_params, "mem": cpu_params}, {}, {})


@pytest.mark.parametrize("policy", LIVE_POLICIES)
def test_a_containers_live_state_does_not_grow_with_its_age(policy):
    """The state is running summaries, never the trace: its JSON is about as long after 2,000 steps as after
    100 (VPA's histograms hold at most a few hundred buckets, whatever the age)."""
    params = PoliciesConfig(interval_steps=10)
    deployment = Deployment({"cpu": policy, "mem": policy}, {"cpu": params, "mem": params}, STATS, TRANSITIONS, "m",
                            _forecasters())
    sizes = {}
    for t, live in enumerate(_live(deployment, _trace(5, 2000))):
        if t + 1 in (100, 2000):
            sizes[t + 1] = len(live.dumps())
    assert sizes[2000] < 1.5 * sizes[100] + 2000, sizes


def test_a_state_of_other_policies_starts_afresh():
    """A model change mid-stream: the summaries of other rules mean nothing to the new ones; the container keeps
    its step count and the new policies decide from its next interval on."""
    params = PoliciesConfig(interval_steps=10)
    old = Deployment({"cpu": "vpa", "mem": "vpa"}, {"cpu": params, "mem": params}, {}, {}, "old")
    new = Deployment({"cpu": "prev.step.max", "mem": "prev.step.max"}, {"cpu": params, "mem": params}, {}, {}, "new")
    *_, live = _live(old, _trace(4, 25))
    moved = LivePolicies.loads(new, live.dumps())
    assert moved.steps == 25 and moved.next_allocation()["cpu"] != moved.next_allocation()["cpu"]  # NaN: no limit yet
    for _ in range(5):  # the rest of the interval in progress, then the new rule decides
        moved.observe(0.0, {"cpu": 1.0, "mem": GB}, {"cpu": 4.0, "mem": 8 * GB})
    assert moved.next_allocation()["cpu"] == 1.0

"""A container's deployed policies, live: what they allocate for the coming step, from running summaries only.

The stream sees a container's samples one micro-batch at a time and must say, after each, what the deployed
policy allocates for the next step: the same number the replay of the whole trace holds at that step
(:mod:`ai4dl.policies.replay`), or the product deploys something it never evaluated. Replaying the stored trace
at every batch would make a container's state and work grow with its age; instead :class:`LivePolicies` keeps,
per resource, what the rules read (:mod:`ai4dl.policies.rules`), all O(1) in the container's age:

* the values of the interval being filled (at most ``interval_steps``) and the last full interval's max, mean
  and std (reactive rules, ``phase.headroom``);
* the last labelled phase, how many labelled steps it has lasted, and the last known limit (phase rules);
* for the forecasters, the last :data:`~ai4dl.policies.forecast.HISTORY` intervals' summaries;
* the decision in force for this interval, raised by OOM kills, and whether the last step was above it;
* for ``vpa``, the recommender itself: its decaying histograms and window peaks
  (:meth:`~ai4dl.policies.vpa.VpaRecommender.state`).

Each decision is made by the rules' own functions on one-element arrays, so its numbers are the replay's
(``tests/test_live_policies.py`` checks every policy family step by step, across restarts of the state).
The state is a JSON text (:meth:`LivePolicies.dumps`), what Spark's state store keeps between micro-batches.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ai4dl.config import LIVE_POLICIES, PoliciesConfig
from ai4dl.errors import InputError
from ai4dl.policies.forecast import FORECASTS, HISTORY, SUMMARY, Forecaster, TraceInputs, design, interval_stats
from ai4dl.policies.model import PolicyModel
from ai4dl.policies.rules import (
    RESOURCES,
    headroom_decisions,
    in_force,
    normalise_stats,
    oom_bump,
    oom_step,
    phase_decisions,
    reactive_decisions,
    vpa_params,
)
from ai4dl.policies.vpa import VpaRecommender


@dataclass(frozen=True)
class Deployment:
    """What the live allocations are decided with: per resource the deployed policy and its parameters (the
    policy model's calibrated knob), and the model's phase statistics and transition probabilities."""

    policies: Mapping[str, str]
    params: Mapping[str, PoliciesConfig]
    phase_stats: Mapping[int, Mapping[str, Any]]
    successors: Mapping[int, Mapping[int, float]]
    model_id: str = "-"
    forecasters: Mapping[str, Mapping[str, Forecaster]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {r: p for r, p in self.policies.items() if p not in LIVE_POLICIES}
        if bad or set(self.policies) != set(RESOURCES):
            raise InputError(f"a deployment needs a live policy per resource ({', '.join(RESOURCES)}), got {dict(self.policies)}")
        lengths = {int(p.interval_steps) for p in self.params.values()}
        if len(lengths) != 1:
            raise InputError(f"the resources' policies use different interval_steps {sorted(lengths)}")

    @classmethod
    def of(cls, model: PolicyModel, choice: str = "best") -> "Deployment":
        policies = model.deployment(choice)
        return cls(policies, {r: model.params_for(p, r) for r, p in policies.items()},
                   normalise_stats(model.phase_stats), model.transitions, model.model_id, model.forecasters)

    @classmethod
    def limits(cls, params: PoliciesConfig | None = None) -> "Deployment":
        """``static`` for both resources (the limit, no model): for a stream whose phases alone matter."""
        params = params or PoliciesConfig()
        return cls({r: "static" for r in RESOURCES}, {r: params for r in RESOURCES}, {}, {})

    @property
    def interval_steps(self) -> int:
        return int(next(iter(self.params.values())).interval_steps)


class _Resource:
    """One resource's running summaries (see the module docstring)."""

    def __init__(self, policy: str, params: PoliciesConfig) -> None:
        self.policy, self.params = policy, params
        self.block: list[float] = []  # the usage of the interval being filled
        self.prev = (math.nan, math.nan, math.nan)  # the last full interval's max, mean, std
        self.history: list[list[float]] = []  # the last full intervals' SUMMARY, most recent first (forecasters)
        self.decision = math.nan  # in force for the current interval (NaN: the limit)
        self.limit = math.nan  # the last known limit
        self.prev_over, self.prev_alloc = False, math.nan
        self.vpa = VpaRecommender(vpa_params(params, True)) if policy == "vpa" else None

    def state(self) -> dict[str, Any]:
        return {"block": self.block, "prev": list(self.prev), "history": self.history, "decision": self.decision,
                "limit": self.limit,
                "prev_over": self.prev_over, "prev_alloc": self.prev_alloc,
                "vpa": None if self.vpa is None else self.vpa.state()}

    def restore(self, state: Mapping[str, Any]) -> "_Resource":
        num = lambda v: math.nan if v is None else float(v)  # noqa: E731  (JSON has no NaN: null)
        self.block = [num(v) for v in state["block"]]
        self.prev = tuple(num(v) for v in state["prev"])  # type: ignore[assignment]
        self.history = [[num(v) for v in h] for h in state.get("history", [])]
        self.decision, self.limit = num(state["decision"]), num(state["limit"])
        self.prev_over, self.prev_alloc = bool(state["prev_over"]), num(state["prev_alloc"])
        if self.vpa is not None:
            self.vpa = VpaRecommender.from_state(self.vpa.params, state["vpa"])
        return self


class LivePolicies:
    """The deployed policies of one container, fed its steps in order (:meth:`observe`), asked what they
    allocate for the next step (:meth:`next_allocation`), kept between micro-batches as JSON (:meth:`dumps`,
    :meth:`loads`)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.steps = 0  # steps observed; the next one is step number `steps`
        self.phase = math.nan  # the last labelled phase
        self.run = 0  # labelled steps the last labelled phase has lasted
        self.resources = {r: _Resource(deployment.policies[r], deployment.params[r]) for r in RESOURCES}

    # ---- one step ----
    def observe(self, t_seconds: float, usage: Mapping[str, float], limit: Mapping[str, float], phase: Any = None) -> None:
        """Step number :attr:`steps`: its time (Unix seconds), usage and limit per resource, its phase (None:
        unlabelled). Then, at the end of an interval, the next interval's decisions."""
        length = self.deployment.interval_steps
        for resource, state in self.resources.items():
            u, lim = _num(usage.get(resource)), _num(limit.get(resource))
            self._step(resource, state, t_seconds, u, lim)
            state.block.append(u)
            if lim == lim:
                state.limit = lim
        if phase is not None and phase == phase:
            self.run = self.run + 1 if float(phase) == self.phase else 1
            self.phase = float(phase)
        self.steps += 1
        if self.steps % length == 0:
            for resource, state in self.resources.items():
                summary = [float(v) for v in interval_stats(np.asarray(state.block, dtype=float), length)[0]]
                state.prev = tuple(summary[:3])  # max, mean, std: what the reactive rules read
                if state.policy in FORECASTS:
                    state.history = [summary, *state.history][:HISTORY]
                state.block = []
                state.decision = self._decide(resource, state)

    def _step(self, resource: str, state: _Resource, t_seconds: float, u: float, lim: float) -> None:
        rec = state.vpa
        sample = u >= 0 and t_seconds == t_seconds  # what VPA takes as a sample (the replay's rule)
        t_ns = VpaRecommender.time_ns(t_seconds) if rec is not None and sample else 0
        if resource == "cpu":
            if rec is not None and sample:
                rec.add_cpu_at(t_ns, VpaRecommender.cpu_amount(u))
            return
        alloc, over, killed = oom_step(state.decision, u, lim, state.prev_over, state.prev_alloc)
        if rec is None:
            if killed:
                state.decision = max(alloc, oom_bump(u))
        else:
            if killed and sample:
                rec.record_oom_at(t_ns, alloc)
            if sample:
                rec.add_memory_at(t_ns, VpaRecommender.memory_amount(u))
                if killed:
                    target = rec.target("mem", float(state.params.vpa_percentile))
                    if target is not None:
                        state.decision = target
        state.prev_over, state.prev_alloc = over, alloc

    def _decide(self, resource: str, state: _Resource) -> float:
        """The coming interval's decision, by the rules the replay applies to every interval."""
        policy, params, d = state.policy, state.params, self.deployment
        if policy == "static":
            return math.nan
        if policy == "vpa":
            target = state.vpa.target(resource, float(params.vpa_percentile))
            return math.nan if target is None else float(target)
        one = lambda v: np.array([v], dtype=float)  # noqa: E731
        if policy in ("prev.step.max", "prev.step.rules"):
            return float(reactive_decisions(policy, params, *(one(v) for v in state.prev))[0])
        phase, limit = one(self.phase), one(state.limit)
        if policy in FORECASTS:
            fc = d.forecasters.get(policy, {}).get(resource)
            if fc is None:
                return math.nan
            hist = np.full((1, HISTORY, len(SUMMARY)), np.nan)
            for k, summary in enumerate(state.history):
                hist[0, k, :] = summary
            run = one(self.run if self.phase == self.phase else math.nan)
            inputs = TraceInputs(design(hist, limit, phase, run, fc.phases), hist[:, 0, 0], limit, one(math.nan))
            return float(fc.forecast(inputs).decisions(float(params.forecast_miss_cost))[0])
        if policy == "phase.headroom":
            return float(headroom_decisions(one(state.prev[0]), phase, limit, params, d.phase_stats, resource)[0])
        successors = d.successors if policy == "phase.proactive" else None
        return float(phase_decisions(phase, limit, params, d.phase_stats, resource, successors)[0])

    # ---- the recommendation ----
    def next_allocation(self) -> dict[str, Any]:
        """What the deployed policies allocate for step :attr:`steps` (the one after the last observed):
        ``{"step", "interval", "cpu", "mem", "cpu_limit", "mem_limit"}``, capped at the last known limit."""
        out: dict[str, Any] = {"step": self.steps, "interval": self.steps // self.deployment.interval_steps}
        for resource, state in self.resources.items():
            out[resource] = in_force(state.decision, state.limit)
            out[f"{resource}_limit"] = state.limit
        return out

    # ---- kept between micro-batches ----
    def dumps(self) -> str:
        return json.dumps({"steps": self.steps, "phase": _json(self.phase), "run": self.run,
                           "resources": {r: _json(s.state()) for r, s in self.resources.items()},
                           "policies": dict(self.deployment.policies), "model": self.deployment.model_id})

    @classmethod
    def loads(cls, deployment: Deployment, text: str | None) -> "LivePolicies":
        """The state :meth:`dumps` wrote, or a new one (None). A state written under other policies or another
        policy model starts afresh from its next interval: its summaries mean nothing to the new rules."""
        live = cls(deployment)
        if not text:
            return live
        state = json.loads(text)
        live.steps = int(state["steps"])
        live.phase = _num(state["phase"])
        live.run = int(state.get("run", 0))
        if state.get("policies") != dict(deployment.policies) or state.get("model") != deployment.model_id:
            for r in live.resources.values():  # the interval in progress keeps the limit; decisions resume next
                r.block = [math.nan] * (live.steps % deployment.interval_steps)
            return live
        for r, s in state["resources"].items():
            live.resources[r].restore(s)
        return live


def _num(v: Any) -> float:
    try:
        return math.nan if v is None else float(v)
    except (TypeError, ValueError):
        return math.nan


def _json(value: Any) -> Any:
    """NaN as null (JSON has none), recursively."""
    if isinstance(value, float):
        return value if value == value else None
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


__all__ = ["Deployment", "LivePolicies"]

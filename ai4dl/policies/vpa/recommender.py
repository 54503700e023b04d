"""One container's VPA recommender (``ContainerState`` + ``AggregateContainerState`` of ``pkg/recommender/model``
and the estimators of ``pkg/recommender/logic``): its parameters, feeding, OOM events, targets and bounds,
and the CPU targets of a whole trace in one pass (:func:`cpu_targets`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np

from ai4dl.errors import InputError
from ai4dl.policies.vpa.histogram import (
    _MAX_DECAY_EXPONENT,
    _MAX_DURATION_S,
    _MEMORY_PEAK_WEIGHT,
    _MIN_SAMPLE_WEIGHT,
    _buckets,
    _DecayingHistogram,
    _duration_minutes,
    _go_div,
    _go_exp2,
    _go_pow,
    _resource_amount,
    _round_time,
    _scale_resource,
    _seconds_to_ns,
    _step_to_ns,
    _sub,
    _trunc_mod,
    _unix_seconds_to_ns,
)

# --------------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VpaParams:
    """VPA's knobs, with the defaults of the v1.8.1 recommender binary (``config.DefaultRecommenderConfig``).

    Durations are in seconds. ``step_seconds`` > 0 ignores the sample timestamps and places sample k at
    ``k * step_seconds`` (step-indexed time, as the harness's ``-step-seconds``). ``oom_on_shortfall`` turns on
    the harness's closed loop in :func:`recommend_trace`. ``memory_aggregation_interval_count`` only drives
    VPA's expiry of idle containers and does not change any recommendation here.
    """

    target_cpu_percentile: float = 0.9
    lower_bound_cpu_percentile: float = 0.5
    upper_bound_cpu_percentile: float = 0.95
    target_memory_percentile: float = 0.9
    lower_bound_memory_percentile: float = 0.5
    upper_bound_memory_percentile: float = 0.95
    safety_margin_fraction: float = 0.15
    pod_min_cpu_millicores: float = 25.0
    pod_min_memory_mb: float = 250.0
    cpu_half_life_s: float = 86400.0
    memory_half_life_s: float = 86400.0
    memory_aggregation_interval_s: float = 86400.0
    memory_aggregation_interval_count: int = 8
    confidence_interval_cpu_s: float = 86400.0
    confidence_interval_memory_s: float = 86400.0
    upper_bound_confidence_multiplier: float = 1.0
    upper_bound_confidence_exponent: float = 1.0
    lower_bound_confidence_multiplier: float = 0.001
    lower_bound_confidence_exponent: float = -2.0
    cpu_histogram_first_bucket_cores: float = 0.01
    cpu_histogram_max_cores: float = 1000.0
    memory_histogram_first_bucket_bytes: float = 1e7
    memory_histogram_max_bytes: float = 1e12
    histogram_bucket_growth: float = 0.05
    oom_bump_up_ratio: float = 1.2
    oom_min_bump_up_bytes: float = 100.0 * 1024 * 1024
    oom_on_shortfall: bool = False
    step_seconds: float = 0.0

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, allowed: str) -> InputError:
            return InputError(f"VpaParams.{name}={value!r} is invalid: {allowed}")

        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if name == "oom_on_shortfall":
                if not isinstance(value, (bool, np.bool_)):
                    raise bad(name, value, "must be True or False")
                object.__setattr__(self, name, bool(value))
                continue
            if name == "memory_aggregation_interval_count":
                if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
                    raise bad(name, value, "must be an integer >= 1")
                object.__setattr__(self, name, int(value))
                continue
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise bad(name, value, "must be a real number")
            value = float(value)
            if not math.isfinite(value):
                raise bad(name, value, "must be finite")
            object.__setattr__(self, name, value)

        for name in (
            "target_cpu_percentile",
            "lower_bound_cpu_percentile",
            "upper_bound_cpu_percentile",
            "target_memory_percentile",
            "lower_bound_memory_percentile",
            "upper_bound_memory_percentile",
        ):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise bad(name, v, "a percentile must be between 0 and 1 (e.g. 0.9 for p90)")
        for name in ("safety_margin_fraction", "pod_min_cpu_millicores", "pod_min_memory_mb", "oom_min_bump_up_bytes"):
            v = getattr(self, name)
            if v < 0:
                raise bad(name, v, "must be >= 0")
        for name in (
            "cpu_half_life_s",
            "memory_half_life_s",
            "memory_aggregation_interval_s",
            "confidence_interval_cpu_s",
            "confidence_interval_memory_s",
        ):
            v = getattr(self, name)
            if not 0 < v <= _MAX_DURATION_S or _seconds_to_ns(v) <= 0:
                raise bad(name, v, f"a duration in seconds must be > 0 (at least 1 ns) and <= {_MAX_DURATION_S:.0f} s")
        for name in (
            "upper_bound_confidence_multiplier",
            "lower_bound_confidence_multiplier",
            "cpu_histogram_first_bucket_cores",
            "cpu_histogram_max_cores",
            "memory_histogram_first_bucket_bytes",
            "memory_histogram_max_bytes",
            "histogram_bucket_growth",
        ):
            v = getattr(self, name)
            if v <= 0:
                raise bad(name, v, "must be > 0")
        if self.oom_bump_up_ratio < 1.0:
            raise bad("oom_bump_up_ratio", self.oom_bump_up_ratio, "must be >= 1 (VPA's default is 1.2)")
        if self.step_seconds < 0:
            raise bad("step_seconds", self.step_seconds, "must be >= 0 (0 = use the sample timestamps)")


# --------------------------------------------------------------------------------------------------------
# One container: ContainerState + AggregateContainerState (pkg/recommender/model) and the estimators of
# pkg/recommender/logic.
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """One VPA recommendation: CPU in cores (whole millicores), memory in bytes (whole bytes)."""

    cpu_target: float
    mem_target: float
    cpu_lower: float
    mem_lower: float
    cpu_upper: float
    mem_upper: float

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _usable(v: Any) -> float | None:
    """A usage value as the harness reads it: missing, NaN or negative means 'no sample'."""
    if v is None:
        return None
    v = float(v)
    if v != v or v < 0:
        return None
    return v


class VpaRecommender:
    """The VPA state of one container: feed samples in time order, ask for a recommendation at any time.

    Times are Unix seconds (float); with ``params.step_seconds > 0`` use :meth:`add_sample_at_step` (or
    :func:`recommend_trace`) to place sample k at ``k * step_seconds`` as the harness does.
    """

    def __init__(self, params: VpaParams = VpaParams()):
        if not isinstance(params, VpaParams):
            raise TypeError(f"params must be a VpaParams, got {type(params).__name__}")
        self.params = params
        self._cpu_buckets = _buckets(
            params.cpu_histogram_max_cores, params.cpu_histogram_first_bucket_cores, params.histogram_bucket_growth
        )
        self._mem_buckets = _buckets(
            params.memory_histogram_max_bytes, params.memory_histogram_first_bucket_bytes, params.histogram_bucket_growth
        )
        self._cpu = _DecayingHistogram(self._cpu_buckets, _seconds_to_ns(params.cpu_half_life_s))
        self._mem = _DecayingHistogram(self._mem_buckets, _seconds_to_ns(params.memory_half_life_s))
        self._mem_interval_ns = _seconds_to_ns(params.memory_aggregation_interval_s)
        self._conf_cpu_ns = _seconds_to_ns(params.confidence_interval_cpu_s)
        self._conf_mem_ns = _seconds_to_ns(params.confidence_interval_memory_s)
        # AggregateContainerState
        self.total_samples = 0  # CPU samples accepted
        self._first_sample_ns = 0
        self._last_sample_ns = 0
        # ContainerState
        self._last_cpu_ns = 0
        self._last_mem_ns = 0
        self._window_end_ns = 0
        self._memory_peak = 0
        self._oom_peak = 0
        self.oom_events = 0
        self._targets: dict[tuple[str, float], int] = {}  # (resource, percentile's value) -> target amount

    # ---- state, for a store that keeps it between calls (the live stream) ----
    _SCALARS = ("total_samples", "_first_sample_ns", "_last_sample_ns", "_last_cpu_ns", "_last_mem_ns",
                "_window_end_ns", "_memory_peak", "_oom_peak", "oom_events")

    def state(self) -> dict:
        """The container's whole VPA state as JSON values (two decaying histograms of a few hundred buckets and
        a dozen numbers): O(1) in the container's age. :meth:`from_state` gives a recommender that answers, and
        goes on, exactly as this one would."""
        return {"cpu": self._cpu.state(), "mem": self._mem.state(), **{k.lstrip("_"): getattr(self, k) for k in self._SCALARS}}

    @classmethod
    def from_state(cls, params: VpaParams, state: dict) -> "VpaRecommender":
        rec = cls(params)
        rec._cpu.restore(state["cpu"])
        rec._mem.restore(state["mem"])
        for k in cls._SCALARS:
            setattr(rec, k, int(state[k.lstrip("_")]))
        return rec

    # ---- feeding ----
    def add_sample(self, t_seconds: float, cpu_cores: float | None = None, mem_bytes: float | None = None) -> tuple[bool, bool]:
        """Add one measurement (CPU first, then memory, as the harness). ``None``/NaN/negative = no sample.

        Returns whether VPA accepted the CPU and the memory sample (it drops out-of-order ones)."""
        return self._add_at(_unix_seconds_to_ns(float(t_seconds)), cpu_cores, mem_bytes)

    def add_sample_at_step(self, k: int, cpu_cores: float | None = None, mem_bytes: float | None = None) -> tuple[bool, bool]:
        """Add sample number k at time ``k * params.step_seconds`` (step-indexed time)."""
        return self._add_at(_step_to_ns(int(k), self.params.step_seconds), cpu_cores, mem_bytes)

    def record_oom(self, t_seconds: float, mem_bytes_request: float) -> None:
        """VPA's ``ContainerState.RecordOOM``: the container was OOM-killed at t with this memory request."""
        self._record_oom(_unix_seconds_to_ns(float(t_seconds)), mem_bytes_request)

    def record_oom_at_step(self, k: int, mem_bytes_request: float) -> None:
        """:meth:`record_oom` at the time of sample number k (step-indexed time)."""
        self._record_oom(_step_to_ns(int(k), self.params.step_seconds), mem_bytes_request)

    # ---- feeding in VPA's own clock: a replay converts each sample once for several recommenders ----
    @staticmethod
    def time_ns(t_seconds: float | None = None, step: int | None = None, step_seconds: float = 0.0) -> int:
        """A sample's time as VPA sees it (ns since Go's zero time): Unix seconds as the harness converts them,
        or sample number ``step`` at ``step * step_seconds``."""
        if t_seconds is not None:
            return _unix_seconds_to_ns(float(t_seconds))
        return _step_to_ns(int(step), float(step_seconds))

    @staticmethod
    def cpu_amount(cores: float) -> int:
        """A CPU sample as VPA stores it: whole millicores, truncated."""
        return _resource_amount(float(cores) * 1000.0)

    @staticmethod
    def memory_amount(mem_bytes: float) -> int:
        """A memory sample as VPA stores it: whole bytes, truncated."""
        return _resource_amount(float(mem_bytes))

    def add_cpu_at(self, t_ns: int, millicores: int) -> bool:
        """:meth:`add_sample` of a CPU sample already in VPA's units (:meth:`time_ns`, :meth:`cpu_amount`)."""
        return self._add_cpu_millicores(t_ns, millicores)

    def add_memory_at(self, t_ns: int, mem_bytes: int) -> bool:
        """:meth:`add_sample` of a memory sample already in VPA's units (:meth:`time_ns`, :meth:`memory_amount`)."""
        return self._add_memory(t_ns, mem_bytes, False)

    def add_memory_run(self, times_ns: Sequence[int], amounts: Sequence[int], start: int, end: int) -> None:
        """:meth:`add_memory_at` of samples ``start .. end - 1`` of these lists, in order. Most samples of a
        memory window are below its peak and change nothing but the last sample time: those take a short path."""
        for j in range(start, end):
            t, usage = times_ns[j], amounts[j]
            if self._last_mem_ns <= t < self._window_end_ns:
                peak = max(self._memory_peak, self._oom_peak)
                if usage <= peak or peak == 0:  # not a new peak of the current window
                    self._last_mem_ns = t
                    continue
            self._add_memory(t, usage, False)

    def add_quiet_memory_run(self, first_ns: int, last_ns: int, peak: int) -> bool:
        """:meth:`add_memory_run` of a run of samples known by its first and last time (times not decreasing in
        between) and its highest amount, when that run changes nothing but the last sample time (every sample
        within the current memory window, none above its peak): then record that and return True; else change
        nothing and return False (feed the samples)."""
        if not self._last_mem_ns <= first_ns <= last_ns < self._window_end_ns:
            return False
        top = max(self._memory_peak, self._oom_peak)
        if peak > top and top != 0:
            return False
        self._last_mem_ns = last_ns
        return True

    @property
    def state_version(self) -> int:
        """A number that changes whenever the histograms do: targets asked again before it changes are the same."""
        return self._cpu.version + self._mem.version

    def record_oom_at(self, t_ns: int, mem_bytes_request: float) -> None:
        """:meth:`record_oom` at a time already in VPA's clock (:meth:`time_ns`)."""
        self._record_oom(t_ns, mem_bytes_request)

    def _add_at(self, t_ns: int, cpu_cores: Any, mem_bytes: Any) -> tuple[bool, bool]:
        c, m = _usable(cpu_cores), _usable(mem_bytes)
        ok_c = self._add_cpu(t_ns, c) if c is not None else False
        ok_m = self._add_memory(t_ns, _resource_amount(m), False) if m is not None else False
        return ok_c, ok_m

    def _add_cpu(self, t_ns: int, cores: float) -> bool:
        return self._add_cpu_millicores(t_ns, _resource_amount(cores * 1000.0))  # whole millicores, truncated

    def _add_cpu_millicores(self, t_ns: int, usage: int) -> bool:
        if not t_ns > self._last_cpu_ns:
            return False  # duplicate or out-of-order
        self._cpu.add_sample(float(usage) / 1000.0, _MIN_SAMPLE_WEIGHT, t_ns)
        if t_ns > self._last_sample_ns:
            self._last_sample_ns = t_ns
        if self._first_sample_ns == 0 or t_ns < self._first_sample_ns:
            self._first_sample_ns = t_ns
        self.total_samples += 1
        self._last_cpu_ns = t_ns
        return True

    def _add_memory(self, t_ns: int, usage: int, is_oom: bool) -> bool:
        if usage < 0 or (not is_oom and t_ns < self._last_mem_ns):
            return False
        self._last_mem_ns = t_ns
        if self._window_end_ns == 0:
            self._window_end_ns = t_ns
        if t_ns < self._window_end_ns:
            old_max = max(self._memory_peak, self._oom_peak)
            if old_max == 0 or usage <= old_max:
                return True
            # a new peak of the current window replaces the old one, both weighed at the window's end
            self._mem.replace_sample(float(old_max), float(usage), _MEMORY_PEAK_WEIGHT, self._window_end_ns)
        else:
            d = _sub(t_ns, self._window_end_ns)
            iv = self._mem_interval_ns
            shift = (d - _trunc_mod(d, iv)) + iv  # Duration.Truncate(interval) + interval
            self._window_end_ns += shift
            self._memory_peak = 0
            self._oom_peak = 0
            self._mem.add_sample(float(usage), _MEMORY_PEAK_WEIGHT, self._window_end_ns)
        if is_oom:
            self._oom_peak = usage
        else:
            self._memory_peak = usage
        return True

    def _record_oom(self, t_ns: int, request_bytes: float) -> None:
        if self._last_mem_ns != 0 and t_ns < self._last_mem_ns - self._mem_interval_ns:
            raise InputError("OOM event discarded: it is older than the last memory sample minus one aggregation interval")
        used = max(_resource_amount(float(request_bytes)), self._memory_peak)
        needed = max(
            used + _resource_amount(self.params.oom_min_bump_up_bytes),
            _scale_resource(used, self.params.oom_bump_up_ratio),
        )
        if not self._add_memory(t_ns, needed, True):
            raise InputError("adding the OOM sample failed")
        self.oom_events += 1

    # ---- estimating ----
    def _confidence(self, interval_ns: int) -> float:
        lifespan = float(_sub(self._last_sample_ns, self._first_sample_ns)) / float(interval_ns)
        samples = float(self.total_samples) / _duration_minutes(interval_ns)
        return min(lifespan, samples)

    def _bounded(self, base: int, multiplier: float, exponent: float, interval_ns: int) -> int:
        c = self._confidence(interval_ns)
        return _scale_resource(base, _go_pow(1.0 + _go_div(multiplier, c), exponent))

    def _min_amount(self, resource: str) -> int:
        """The pod minimum of a resource, in millicores or bytes."""
        if resource == "cpu":
            return _scale_resource(_resource_amount(self.params.pod_min_cpu_millicores * 0.001 * 1000.0), 1.0)
        return _scale_resource(_resource_amount(self.params.pod_min_memory_mb * 1024 * 1024), 1.0)

    def _with_margin(self, resource: str, pct: float) -> int:
        """The ``pct`` percentile plus the safety margin, in millicores or bytes (no minimum yet)."""
        return self._margin_added(resource, (self._cpu if resource == "cpu" else self._mem).percentile(pct))

    def _margin_added(self, resource: str, value: float) -> int:
        base = _resource_amount(value * 1000.0) if resource == "cpu" else _resource_amount(value)
        return base + _scale_resource(base, self.params.safety_margin_fraction)

    def _target_amount(self, resource: str, percentile: float | None = None) -> int:
        pct = percentile
        if pct is None:
            pct = self.params.target_cpu_percentile if resource == "cpu" else self.params.target_memory_percentile
        return self._target_of(resource, (self._cpu if resource == "cpu" else self._mem).percentile(pct))

    def _target_of(self, resource: str, value: float) -> int:
        """The target amount for a percentile's ``value``: margin added, then the pod minimum imposed."""
        amount = self._targets.get((resource, value))  # a percentile is one of the buckets' edges: few values
        if amount is None:
            amount = self._targets[(resource, value)] = max(self._margin_added(resource, value), self._min_amount(resource))
        return amount

    def target(self, resource: str, percentile: float | None = None) -> float | None:
        """The target of one resource (``"cpu"`` in cores, ``"mem"`` in bytes), equal to
        ``recommend().cpu_target`` / ``.mem_target`` but computing one percentile instead of six: a policy
        replay asks for it at every interval start.

        None while that resource has no sample: for CPU exactly when :meth:`recommend` is None; for memory
        before the first memory sample (so a replay that feeds memory alone still gets memory targets, where
        :meth:`recommend` would wait for a CPU sample).

        ``percentile`` replaces the parameters' target percentile for this answer only: the histograms do not
        depend on it, so one recommender fed once answers for several percentiles.
        """
        if resource == "cpu":
            if self.total_samples == 0:
                return None
            return self._target_amount("cpu", percentile) / 1000.0
        if resource == "mem":
            if self._window_end_ns == 0:
                return None
            return float(self._target_amount("mem", percentile))
        raise InputError(f"VpaRecommender.target: resource must be 'cpu' or 'mem', got {resource!r}")

    def recommend(self) -> Recommendation | None:
        """Target / lower / upper bound as ``GetRecommendedPodResources`` gives them now, or None before the
        first CPU sample (the harness prints no recommendation then)."""
        if self.total_samples == 0:
            return None
        p = self.params
        floor = {"cpu": self._min_amount("cpu"), "mem": self._min_amount("mem")}
        confidence = {"cpu": self._conf_cpu_ns, "mem": self._conf_mem_ns}

        def bound(resource: str, percentile: float, multiplier: float, exponent: float) -> float:
            return max(self._bounded(self._with_margin(resource, percentile), multiplier, exponent, confidence[resource]),
                       floor[resource])

        cpu_l = bound("cpu", p.lower_bound_cpu_percentile, p.lower_bound_confidence_multiplier, p.lower_bound_confidence_exponent)
        mem_l = bound("mem", p.lower_bound_memory_percentile, p.lower_bound_confidence_multiplier, p.lower_bound_confidence_exponent)
        cpu_u = bound("cpu", p.upper_bound_cpu_percentile, p.upper_bound_confidence_multiplier, p.upper_bound_confidence_exponent)
        mem_u = bound("mem", p.upper_bound_memory_percentile, p.upper_bound_confidence_multiplier, p.upper_bound_confidence_exponent)
        return Recommendation(
            cpu_target=self._target_amount("cpu") / 1000.0,
            mem_target=float(self._target_amount("mem")),
            cpu_lower=cpu_l / 1000.0,
            mem_lower=float(mem_l),
            cpu_upper=cpu_u / 1000.0,
            mem_upper=float(mem_u),
        )


_ENDS_PER_BLOCK = 4096  # cpu_targets answers this many ends at a time


def cpu_targets(
    times_ns: Sequence[int], millicores: Sequence[int], ends: Sequence[int], percentiles: Sequence[float], params: VpaParams
) -> np.ndarray:
    """The CPU target (cores) that a :class:`VpaRecommender` fed CPU samples ``0 .. e - 1`` of these lists (VPA's
    clock and units, :meth:`~VpaRecommender.time_ns`, :meth:`~VpaRecommender.cpu_amount`) gives at each ``e`` of
    ``ends`` (ascending), for each percentile: shape ``(len(percentiles), len(ends))``, NaN before its first sample.

    Why not feed a recommender: a replay asks at every interval start and for every percentile of a knob grid,
    and a CPU sample does not depend on any decision. Here each sample's bucket and decayed weight is computed
    once, each bucket's weight at each end is a running sum in sample order (the recommender's own additions in
    its own order, so the same doubles), and a percentile is the first bucket whose cumulative weight in bucket
    order reaches ``p * total``, for every end at once. A trace longer than 100 half-lives (the histogram
    re-bases and rescales its weights mid-trace) is fed to a recommender instead."""
    ends_arr = np.asarray(ends, dtype=np.int64)
    asked = [float(q) for q in percentiles]
    out = np.full((len(asked), len(ends_arr)), np.nan)
    accepted, last = [], 0
    for j, t in enumerate(times_ns):  # VPA drops a sample not later than the last one it took
        if t > last:
            accepted.append(j)
            last = t
    if not accepted:
        return out
    half_life = _seconds_to_ns(params.cpu_half_life_s)
    horizon = half_life * _MAX_DECAY_EXPONENT
    first = times_ns[accepted[0]]
    reference = _round_time(first, half_life) if first > horizon else 0  # the first sample's re-base of an empty histogram
    if last > reference + horizon:
        return _fed_cpu_targets(times_ns, millicores, ends_arr, asked, params)
    buckets = _buckets(params.cpu_histogram_max_cores, params.cpu_histogram_first_bucket_cores, params.histogram_bucket_growth)
    bucket = np.array([buckets.find_bucket(float(millicores[j]) / 1000.0) for j in accepted])
    hl = float(half_life)
    weight = np.array([_MIN_SAMPLE_WEIGHT * _go_exp2(float(times_ns[j] - reference) / hl) for j in accepted])
    fed = np.searchsorted(np.asarray(accepted), ends_arr, side="left")  # samples taken before each end
    running_total = np.cumsum(weight)
    live = np.unique(bucket)
    runs = []  # per bucket in use: its samples' positions among the accepted ones, and its running weight
    for b in live:
        mine = np.flatnonzero(bucket == b)
        runs.append((mine, np.cumsum(weight[mine])))
    column = np.arange(len(live))
    has = fed > 0
    chosen = np.zeros((len(asked), len(ends_arr)), dtype=np.int64)
    for lo in range(0, len(ends_arr), _ENDS_PER_BLOCK):  # memory bounded by a block of ends x the buckets in use
        block = fed[lo:lo + _ENDS_PER_BLOCK]
        per_bucket = np.zeros((len(block), len(live)))
        for c, (mine, running) in enumerate(runs):
            taken = np.searchsorted(mine, block, side="left")
            per_bucket[:, c] = np.where(taken > 0, running[np.maximum(taken - 1, 0)], 0.0)
        cumulative = np.cumsum(per_bucket, axis=1)  # in bucket order; a bucket without weight adds 0.0, as VPA's loop
        seen = per_bucket > 0.0  # every sample weighs >= 0.1 * 2**-0.5, far above the histogram's epsilon
        lowest = seen.argmax(axis=1)
        highest = len(live) - 1 - seen[:, ::-1].argmax(axis=1)
        in_range = (column >= lowest[:, None]) & (column < highest[:, None])
        total = running_total[np.maximum(block - 1, 0)]
        for i, q in enumerate(asked):
            reached = (cumulative >= (q * total)[:, None]) & in_range
            chosen[i, lo:lo + len(block)] = live[np.where(reached.any(axis=1), reached.argmax(axis=1), highest)]
    edges, where = np.unique(chosen[:, has], return_inverse=True)  # the target is a function of the percentile's bucket
    rec = VpaRecommender(params)
    targets = [rec._target_of("cpu", buckets.upper_edge(b)) / 1000.0 for b in edges.tolist()]
    out[:, has] = np.asarray(targets)[where.reshape(chosen[:, has].shape)]
    return out


def _fed_cpu_targets(times_ns: Sequence[int], millicores: Sequence[int], ends: np.ndarray, asked: list[float], params: VpaParams) -> np.ndarray:
    """:func:`cpu_targets` by feeding one recommender sample by sample."""
    out = np.full((len(asked), len(ends)), np.nan)
    rec = VpaRecommender(params)
    j = 0
    for e, end in enumerate(ends.tolist()):
        while j < min(end, len(times_ns)):
            rec.add_cpu_at(times_ns[j], millicores[j])
            j += 1
        for i, q in enumerate(asked):
            target = rec.target("cpu", q)
            if target is not None:
                out[i, e] = target
    return out



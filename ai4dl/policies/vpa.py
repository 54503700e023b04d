"""The Kubernetes VPA recommender (v1.8.1), re-implemented decision for decision in plain Python + numpy.

This module reproduces what ``k8s.io/autoscaler/vertical-pod-autoscaler`` v1.8.1 computes in
``pkg/recommender/model`` (decaying histograms, per-interval memory peaks, OOM handling) and
``pkg/recommender/logic`` (percentile, margin, confidence multipliers, minimum resources), driven the way the
conformance harness ``shared/tools/vpa-reference/main.go`` drives it. It imports nothing from Spark and
nothing from the rest of ``ai4dl`` but its error class (bad input or flags: :class:`~ai4dl.errors.InputError`);
the conformance vectors in ``shared/data/vpa`` are matched exactly (``tests/test_vpa.py``).

Why each VPA quirk matters (each one moves the numbers away from a textbook weighted percentile):

* **Bucket upper edge.** VPA keeps usage in a histogram of exponential buckets (first bucket 0.01 core or
  1e7 bytes, each bucket 5 % wider than the previous one) and a percentile is the *start of the next
  bucket* after the one where the cumulative weight reaches ``p * total``, i.e. the bucket's upper edge. A
  container using a steady 0.5 core gets a p90 of ~0.5179 core before any margin, and memory targets
  snap to a small set of values (``1.168723596e9`` bytes shows up all over the vectors).
* **Millicore truncation.** Every resource amount is an ``int64`` (millicores, bytes) made by truncating a
  float: a sample of 0.029 core is ``int(0.029 * 1000) == 28`` millicores, the margin is
  ``base + int(base * 0.15)`` (not ``int(base * 1.15)``), and each bound is truncated again after its
  confidence multiplier. Rounding instead of truncating is off by one millicore in a large share of decisions.
* **Per-window memory peaks.** Memory is not one histogram sample per measurement: there is one sample per
  memory-aggregation interval, the peak of that window, stamped at the *end* of the window and replaced in
  place (subtract old peak, add new) whenever a bigger value arrives. With the 24 h default a whole day of
  samples is a single histogram entry, which is why the memory target barely moves on short traces.
* **Separate half-lives in trace seconds.** CPU and memory histograms decay with their own half-life
  (24 h by default), measured on the sample timestamps (or on ``k * step_seconds`` in step mode), against a
  reference time that is the first sample's time rounded to a multiple of the half-life since Go's zero time
  (year 1). CPU samples all weigh 0.1 before decay, memory peaks weigh 1.0, so mixing half-lives or clocks
  changes both targets and bounds.
* **Margin, then minimum.** The safety margin (15 %) is added to the percentile first, the confidence
  multiplier is applied to bounds next, and only then is the pod minimum (25 millicores, 250 MiB) imposed; a
  tiny container therefore gets exactly the minimum, not minimum + 15 %.
* **Confidence multipliers.** Bounds are widened while history is short:
  ``upper = base * (1 + 1/c)`` and ``lower = base * (1 + 0.001/c) ** -2`` with ``c`` the smaller of
  (history length / 24 h) and (CPU sample count / 1440), so the upper bound starts hundreds of times the
  target and converges over days.
* **OOM bump.** ``RecordOOM(t, request)`` records a *memory sample* of
  ``max(used + 100 MiB, int(used * 1.2))`` with ``used = max(request, current window peak)``; it lands in the
  current window's peak like any other sample, so one OOM lifts the memory histogram by at least 20 %.
  The closed loop of the harness (``oom_on_shortfall``) records one such event per allocation interval, the
  first time usage exceeds the memory target in force.

Floating point is reproduced bit for bit where it decides anything: Go's ``math.Log`` (the amd64 assembly
routine), ``math.Exp2`` and ``math.Pow`` (integer exponents) are ported operation by operation, time is kept
in integer nanoseconds since Go's zero time with Go's saturating ``Sub`` and ``Round``, and cumulative
weights are summed sequentially in bucket order like VPA's loop.

Example (one container, a steady 0.5 core and 300 MB, a sample every 10 s, step-indexed time):

>>> import numpy as np
>>> p = VpaParams(step_seconds=10, cpu_half_life_s=1200, memory_half_life_s=1200,
...               memory_aggregation_interval_s=1200)
>>> out = recommend_trace(np.arange(30) * 10.0, np.full(30, 0.5), np.full(30, 3e8), interval=10, params=p)
>>> [tuple(row) for row in out[["sample_index", "cpu_target", "mem_target"]].itertuples(index=False)]
[(0, nan, nan), (10, 0.587, 351198544.0), (20, 0.587, 351198544.0)]
>>> 511 + int(511 * 0.15), 305390039 + int(305390039 * 0.15)  # upper edges 0.511 core, 305390039 B; + margin
(587, 351198544)
>>> r = VpaRecommender()                    # VPA's defaults, Unix-second timestamps
>>> for k in range(10):
...     _ = r.add_sample(1_700_000_000 + 10.0 * k, 0.0101, 1e6)
>>> rec = r.recommend()
>>> rec.cpu_target, rec.mem_target          # tiny usage: exactly the pod minimum (25 m, 250 MiB)
(0.025, 262144000.0)
"""

from __future__ import annotations

import csv
import functools
import math
import re
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from ai4dl.errors import InputError

__all__ = [
    "VpaParams",
    "Recommendation",
    "VpaRecommender",
    "recommend_trace",
    "recommend_csv",
    "params_from_flags",
    "parse_duration",
    "OUTPUT_COLUMNS",
    "CSV_COLUMNS",
    "INPUT_COLUMNS",
]

#: Columns of :func:`recommend_trace` (one container).
OUTPUT_COLUMNS = ["timestamp", "sample_index", "cpu_target", "mem_target", "cpu_lower", "mem_lower", "cpu_upper", "mem_upper"]
#: Columns of the CSV written by :func:`recommend_csv` (and of the ``*.rec.csv`` vectors).
CSV_COLUMNS = ["pod_id", *OUTPUT_COLUMNS]
#: Columns of the input CSV of :func:`recommend_csv`.
INPUT_COLUMNS = ["pod_id", "timestamp_seconds", "cpu_cores_used", "memory_bytes_used"]

# Constants of pkg/recommender/model/aggregations_config.go that are not flags.
_MIN_SAMPLE_WEIGHT = 0.1  # weight of every CPU sample before decay
_EPSILON = 0.001 * _MIN_SAMPLE_WEIGHT  # histogram epsilon: a bucket below it counts as empty
_MEMORY_PEAK_WEIGHT = 1.0
_MAX_DECAY_EXPONENT = 100  # the decaying histogram re-bases its reference time after 100 half-lives
_MAX_RESOURCE_AMOUNT = 10**14  # model.MaxResourceAmount

# Go time: nanoseconds since January 1, year 1 (Go's zero time), and int64 durations.
_NS = 10**9
_UNIX_TO_ZERO_SECONDS = 62135596800
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_MAX_DURATION_S = (_INT64_MAX // _MAX_DECAY_EXPONENT) / _NS  # half-life * 100 must fit an int64 of ns


# --------------------------------------------------------------------------------------------------------
# Go's float64 math, ported operation by operation (Go 1.26, amd64) so that bucket indices, decay weights
# and confidence multipliers are bit-identical to the Go recommender.
# --------------------------------------------------------------------------------------------------------

_LN2HI = 6.93147180369123816490e-01
_LN2LO = 1.90821492927058770002e-10
_HSQRT2 = 7.07106781186547524401e-01
_L1 = 6.666666666666735130e-01
_L2 = 3.999999999940941908e-01
_L3 = 2.857142874366239149e-01
_L4 = 2.222219843214978396e-01
_L5 = 1.818357216161805012e-01
_L6 = 1.531383769920937332e-01
_L7 = 1.479819860511658591e-01
_P1 = 1.66666666666666657415e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08


def _go_ldexp(frac: float, exp: int) -> float:
    try:
        return math.ldexp(frac, exp)
    except OverflowError:
        return math.copysign(math.inf, frac)


def _go_log(x: float) -> float:
    """Go's ``math.Log`` on amd64 (``log_amd64.s``, FreeBSD's algorithm; same operations, same order)."""
    if x != x or x == math.inf:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    f1, ki = math.frexp(x)
    k = float(ki)
    if f1 < _HSQRT2:
        k -= 1.0
        f1 *= 2.0
    f = f1 - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_L1 + s4 * (_L3 + s4 * (_L5 + s4 * _L7)))
    t2 = s4 * (_L2 + s4 * (_L4 + s4 * _L6))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2HI - ((hfsq - (s * (hfsq + r) + k * _LN2LO)) - f)


def _go_exp2(x: float) -> float:
    """Go's ``math.Exp2`` (pure Go on amd64)."""
    if x != x:
        return x
    if x > 1.0239999999999999e03:
        return math.inf
    if x < -1.0740e03:
        return 0.0
    k = 0
    if x > 0:
        k = int(x + 0.5)
    elif x < 0:
        k = int(x - 0.5)
    t = x - float(k)
    hi = t * _LN2HI
    lo = -t * _LN2LO
    r = hi - lo
    tt = r * r
    c = r - tt * (_P1 + tt * (_P2 + tt * (_P3 + tt * (_P4 + tt * _P5))))
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    return _go_ldexp(y, k)


def _is_odd_int(x: float) -> bool:
    if abs(x) >= 2.0**53:
        return False
    xf, xi = math.modf(x)
    return xf == 0 and int(xi) & 1 == 1


def _go_pow(x: float, y: float) -> float:
    """Go's ``math.Pow`` (pure Go on amd64). Bit-exact for integer ``y`` (all VPA uses: bucket edges and
    the confidence exponents 1 and -2); a fractional ``y`` goes through Python's ``math.exp``/``math.log``."""
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if x != x or y != y:
        return math.nan
    if x == 0:
        if y < 0:
            return -math.inf if (math.copysign(1.0, x) < 0 and _is_odd_int(y)) else math.inf
        return x if (math.copysign(1.0, x) < 0 and _is_odd_int(y)) else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    if math.isinf(x):
        if x < 0:
            return _go_pow(1.0 / x, -y)
        return 0.0 if y < 0 else math.inf
    if y == 0.5:
        return math.sqrt(x)
    if y == -0.5:
        return 1.0 / math.sqrt(x)
    yf, yi = math.modf(abs(y))
    if yf != 0 and x < 0:
        return math.nan
    if yi >= 2.0**63:
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    a1 = 1.0
    ae = 0
    if yf != 0:
        if yf > 0.5:
            yf -= 1.0
            yi += 1.0
        a1 = math.exp(yf * math.log(x))
    x1, xe = math.frexp(x)
    i = int(yi)
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe
            break
        if i & 1 == 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1.0 / a1
        ae = -ae
    return _go_ldexp(a1, ae)


def _go_div(a: float, b: float) -> float:
    """IEEE division (Python raises on division by zero, Go returns +-Inf or NaN)."""
    if b != 0:
        return a / b
    if a == 0 or a != a:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _go_int64(x: float) -> int:
    """Go's ``int64(float64)`` on amd64: truncation; NaN and out-of-range give the 'integer indefinite' value."""
    if x != x or x >= 2.0**63 or x < -(2.0**63):
        return _INT64_MIN
    return int(x)


def _resource_amount(amount: float) -> int:
    """``model.resourceAmountFromFloat``: clamp to [0, 1e14] and truncate to an int64."""
    if amount > float(_MAX_RESOURCE_AMOUNT):
        return _MAX_RESOURCE_AMOUNT
    if amount < 0:
        amount = 0.0
    return _go_int64(amount)


def _scale_resource(amount: int, factor: float) -> int:
    return _resource_amount(float(amount) * factor)


def _sub(a_ns: int, b_ns: int) -> int:
    """Go's ``Time.Sub``: an int64 Duration, saturated."""
    return min(max(a_ns - b_ns, _INT64_MIN), _INT64_MAX)


def _round_time(t_ns: int, d_ns: int) -> int:
    """Go's ``Time.Round(d)``: nearest multiple of d since the zero time, halfway values rounded up."""
    if d_ns <= 0:
        return t_ns
    r = t_ns % d_ns
    if r + r < d_ns:
        return t_ns - r
    return t_ns + (d_ns - r)


def _unix_seconds_to_ns(ts: float) -> int:
    """What the harness does: ``time.Unix(int64(sec), int64(frac*1e9))`` with ``sec, frac = math.Modf(ts)``."""
    frac, sec = math.modf(ts)
    return (int(sec) + _UNIX_TO_ZERO_SECONDS) * _NS + int(frac * 1e9)


_STEP_BASE_NS = (1_600_000_000 + _UNIX_TO_ZERO_SECONDS) * _NS  # the harness's base time in step mode


def _step_to_ns(k: int, step_seconds: float) -> int:
    return _STEP_BASE_NS + _go_int64(float(k) * step_seconds * 1e9)


def _seconds_to_ns(s: float) -> int:
    return int(round(Fraction(s) * _NS))


def _duration_minutes(d_ns: int) -> float:
    """Go's ``Duration.Minutes``."""
    minute = 60 * _NS
    q = abs(d_ns) // minute * (1 if d_ns >= 0 else -1)
    r = d_ns - q * minute
    return float(q) + float(r) / (60 * 1e9)


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
# Histograms (pkg/recommender/util)
# --------------------------------------------------------------------------------------------------------


class _ExponentialBuckets:
    """``util.NewExponentialHistogramOptions``: bucket b starts at first * (ratio**b - 1) / (ratio - 1)."""

    def __init__(self, max_value: float, first_bucket: float, growth: float):
        self.ratio = 1.0 + growth
        self.first = first_bucket
        self._log_ratio = _go_log(self.ratio)
        self._rm1 = self.ratio - 1.0
        self.num_buckets = int(math.ceil(_go_log(max_value * self._rm1 / first_bucket + 1.0) / self._log_ratio)) + 1
        self.starts = [0.0] + [
            self.first * (_go_pow(self.ratio, float(b)) - 1.0) / self._rm1 for b in range(1, self.num_buckets)
        ]
        self._cache: dict[float, int] = {}

    def upper_edge(self, b: int) -> float:
        """What a percentile falling in bucket ``b`` reports: the next bucket's start (the last bucket's own)."""
        return self.starts[b + 1] if b < len(self.starts) - 1 else self.starts[b]

    def find_bucket(self, value: float) -> int:
        b = self._cache.get(value)
        if b is None:
            if value < self.first:
                b = 0
            else:
                b = min(int(_go_log(value * self._rm1 / self.first + 1.0) / self._log_ratio), self.num_buckets - 1)
            if len(self._cache) < 1_000_000:
                self._cache[value] = b
        return b


@functools.lru_cache(maxsize=16)
def _buckets(max_value: float, first_bucket: float, growth: float) -> _ExponentialBuckets:
    return _ExponentialBuckets(max_value, first_bucket, growth)


class _DecayingHistogram:
    """``util.decayingHistogram`` over ``util.histogram``: weights grow as 2**((t - reference) / half_life)."""

    def __init__(self, buckets: _ExponentialBuckets, half_life_ns: int):
        n = buckets.num_buckets
        self.buckets = buckets
        self.weights = [0.0] * n
        self.total = 0.0
        self.min_bucket = n - 1
        self.max_bucket = 0
        self.half_life_ns = half_life_ns
        self.reference_ns = 0  # Go's zero time
        self.version = 0  # changes with every change of the weights: a percentile stays valid while it does not
        self._factor_at: int | None = None  # the time of the last decay factor computed, and that factor
        self._factor = 1.0

    # -- plain histogram --
    def _add(self, value: float, weight: float) -> None:
        b = self.buckets.find_bucket(value)
        w = self.weights
        self.version += 1
        w[b] += weight
        self.total += weight
        if b < self.min_bucket and w[b] >= _EPSILON:
            self.min_bucket = b
        if b > self.max_bucket and w[b] >= _EPSILON:
            self.max_bucket = b

    def _subtract(self, value: float, weight: float) -> None:
        b = self.buckets.find_bucket(value)
        self.version += 1
        self.total -= weight
        if self.total < _EPSILON:
            self.total = 0.0
        v = self.weights[b] - weight
        self.weights[b] = 0.0 if v < _EPSILON else v
        self._update_min_max()

    def _update_min_max(self) -> None:
        w = self.weights
        last = len(w) - 1
        lo, hi = self.min_bucket, self.max_bucket
        while w[lo] < _EPSILON and lo < last:
            lo += 1
        while w[hi] < _EPSILON and hi > 0:
            hi -= 1
        self.min_bucket, self.max_bucket = lo, hi

    def _scale(self, factor: float) -> None:
        w = self.weights
        self.version += 1
        for b in range(self.min_bucket, self.max_bucket + 1):  # only the live range, as VPA
            w[b] *= factor
        self.total *= factor
        self._update_min_max()

    def is_empty(self) -> bool:
        return self.weights[self.min_bucket] < _EPSILON

    def percentile(self, p: float) -> float:
        """Upper edge of the bucket where the cumulative weight (from the lowest bucket) reaches p * total."""
        if self.is_empty():
            return 0.0
        threshold = p * self.total
        w = self.weights
        bucket = self.min_bucket
        partial = 0.0
        hi = self.max_bucket
        while bucket < hi:  # sequential sum in bucket order, like VPA's loop
            partial += w[bucket]
            if partial >= threshold:
                break
            bucket += 1
        return self.buckets.upper_edge(bucket)

    # -- decay --
    def _decay_factor(self, t_ns: int) -> float:
        if t_ns > self.reference_ns + self.half_life_ns * _MAX_DECAY_EXPONENT:
            self._shift_reference(t_ns)
        if t_ns != self._factor_at:  # memory peaks all land at their window's end: one factor per window
            self._factor_at = t_ns
            self._factor = _go_exp2(float(_sub(t_ns, self.reference_ns)) / float(self.half_life_ns))
        return self._factor

    def _shift_reference(self, new_ref_ns: int) -> None:
        new_ref_ns = _round_time(new_ref_ns, self.half_life_ns)
        self._factor_at = None
        exponent = math.floor(float(_sub(self.reference_ns, new_ref_ns)) / float(self.half_life_ns) + 0.5)
        self._scale(_go_ldexp(1.0, int(exponent)))
        self.reference_ns = new_ref_ns

    def add_sample(self, value: float, weight: float, t_ns: int) -> None:
        self._add(value, weight * self._decay_factor(t_ns))

    def subtract_sample(self, value: float, weight: float, t_ns: int) -> None:
        self._subtract(value, weight * self._decay_factor(t_ns))

    def replace_sample(self, old: float, new: float, weight: float, t_ns: int) -> None:
        """:meth:`subtract_sample` of ``old`` then :meth:`add_sample` of ``new``, at the same time (one decay factor)."""
        w = weight * self._decay_factor(t_ns)
        self._subtract(old, w)
        self._add(new, w)


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
        min_cpu, min_mem = self._min_amount("cpu"), self._min_amount("mem")
        cpu_l = max(
            self._bounded(self._with_margin("cpu", p.lower_bound_cpu_percentile), p.lower_bound_confidence_multiplier, p.lower_bound_confidence_exponent, self._conf_cpu_ns),
            min_cpu,
        )
        mem_l = max(
            self._bounded(self._with_margin("mem", p.lower_bound_memory_percentile), p.lower_bound_confidence_multiplier, p.lower_bound_confidence_exponent, self._conf_mem_ns),
            min_mem,
        )
        cpu_u = max(
            self._bounded(self._with_margin("cpu", p.upper_bound_cpu_percentile), p.upper_bound_confidence_multiplier, p.upper_bound_confidence_exponent, self._conf_cpu_ns),
            min_cpu,
        )
        mem_u = max(
            self._bounded(self._with_margin("mem", p.upper_bound_memory_percentile), p.upper_bound_confidence_multiplier, p.upper_bound_confidence_exponent, self._conf_mem_ns),
            min_mem,
        )
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


def _trunc_mod(d: int, m: int) -> int:
    """Go's ``%`` on int64 (sign of the dividend)."""
    r = abs(d) % abs(m)
    return -r if d < 0 else r


# --------------------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------------------


def _as_float_array(name: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(pd.to_numeric(pd.Series(values, dtype=object), errors="raise"), dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise InputError(f"recommend_trace: {name} must be numbers (missing samples as NaN/None): {exc}") from None
    if arr.ndim != 1:
        raise InputError(f"recommend_trace: {name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _trace_rows(ts: np.ndarray, cpu: np.ndarray, mem: np.ndarray, interval: int, params: VpaParams) -> tuple[list[tuple], int]:
    """The harness's loop for one container; ``ts`` etc. already in feeding order."""
    rec = VpaRecommender(params)
    step = params.step_seconds
    oom = params.oom_on_shortfall
    rows: list[tuple] = []
    nan = math.nan
    cur_mem = nan
    oom_in_interval = False
    ts_l, cpu_l, mem_l = ts.tolist(), cpu.tolist(), mem.tolist()
    for k in range(len(ts_l)):
        t_ns = _step_to_ns(k, step) if step > 0 else _unix_seconds_to_ns(ts_l[k])
        if k % interval == 0:
            oom_in_interval = False
            r = rec.recommend() if k > 0 else None
            if r is None:
                cur_mem = nan
                rows.append((ts_l[k], k, nan, nan, nan, nan, nan, nan))
            else:
                cur_mem = r.mem_target
                rows.append((ts_l[k], k, r.cpu_target, r.mem_target, r.cpu_lower, r.mem_lower, r.cpu_upper, r.mem_upper))
        c = _usable(cpu_l[k])
        if c is not None:
            rec._add_cpu(t_ns, c)
        m = _usable(mem_l[k])
        if oom and not oom_in_interval and m is not None and cur_mem == cur_mem and m > cur_mem:
            rec._record_oom(t_ns, cur_mem)
            oom_in_interval = True
        if m is not None:
            rec._add_memory(t_ns, _resource_amount(m), False)
    return rows, rec.oom_events


def _check_interval(interval: Any) -> int:
    if isinstance(interval, (bool, np.bool_)) or not isinstance(interval, (int, np.integer)) or interval < 1:
        raise InputError(f"interval={interval!r} is invalid: must be an integer >= 1 (samples per allocation interval)")
    return int(interval)


def recommend_trace(
    timestamps: Sequence[float] | np.ndarray,
    cpu: Sequence[float] | np.ndarray,
    mem: Sequence[float] | np.ndarray,
    interval: int = 10,
    params: VpaParams = VpaParams(),
) -> pd.DataFrame:
    """Replay one container's trace through VPA as the harness does, one row per allocation decision.

    Samples are sorted by timestamp (stable) and fed in that order; before sample k = 0, interval,
    2*interval, ... the recommendation given samples 0..k-1 is recorded (NaN at k = 0 and while no CPU sample
    has been accepted). CPU in cores, memory in bytes; NaN/None/negative values are missing samples. With
    ``params.oom_on_shortfall``, the first sample of an interval whose memory exceeds the memory target in
    force is reported as an OOM kill (``RecordOOM`` with that target as the request) before it is added.

    Returns a DataFrame with columns :data:`OUTPUT_COLUMNS`; ``df.attrs["oom_events"]`` counts OOM events.
    """
    interval = _check_interval(interval)
    if not isinstance(params, VpaParams):
        raise TypeError(f"params must be a VpaParams, got {type(params).__name__}")
    ts = _as_float_array("timestamps", timestamps)
    c = _as_float_array("cpu", cpu)
    m = _as_float_array("mem", mem)
    if not (len(ts) == len(c) == len(m)):
        raise InputError(f"recommend_trace: timestamps, cpu and mem differ in length ({len(ts)}, {len(c)}, {len(m)})")
    if len(ts) and not np.all(np.isfinite(ts)):
        bad = int(np.flatnonzero(~np.isfinite(ts))[0])
        raise InputError(f"recommend_trace: timestamps[{bad}] = {ts[bad]!r} is not a finite number of seconds")
    order = np.argsort(ts, kind="stable")
    rows, ooms = _trace_rows(ts[order], c[order], m[order], interval, params)
    df = pd.DataFrame(rows, columns=OUTPUT_COLUMNS)
    df["sample_index"] = df["sample_index"].astype(np.int64)
    df.attrs["oom_events"] = ooms
    return df


# --------------------------------------------------------------------------------------------------------
# CSV in / out
# --------------------------------------------------------------------------------------------------------

_ALIASES = {
    "pod_id": ("pod_id", "pod.id"),
    "timestamp_seconds": ("timestamp_seconds", "timestamp", "ts"),
    "cpu_cores_used": ("cpu_cores_used", "cpu.usage.cores", "cpu_usage_cores"),
    "memory_bytes_used": ("memory_bytes_used", "mem.current", "mem_current"),
}


def _fmt_g(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'g', -1, 64)``; empty for NaN."""
    if v != v:
        return ""
    if v == 0:
        return "0"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    sign, digits, exp = _shortest_digits(v)
    x = len(digits) - 1 + exp
    if x < -4 or x >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    return sign + _fixed(digits, exp)


def _fmt_f(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``."""
    if v == 0:
        return "0"
    sign, digits, exp = _shortest_digits(v)
    return sign + _fixed(digits, exp)


def _shortest_digits(v: float) -> tuple[str, str, int]:
    s = repr(abs(v))
    mant, _, e = s.partition("e")
    exp = int(e) if e else 0
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    exp -= len(fp)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    return ("-" if v < 0 else ""), stripped or "0", exp


def _fixed(digits: str, exp: int) -> str:
    if exp >= 0:
        return digits + "0" * exp
    point = len(digits) + exp
    if point > 0:
        return digits[:point] + "." + digits[point:]
    return "0." + "0" * (-point) + digits


def _read_traces(path: Path) -> tuple[dict[str, list[tuple[float, float, float]]], list[str]]:
    fix_cols = "the header must name pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used"
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot open the input CSV ({exc.strerror}); check the path") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(f"{path}: line 1: the file is empty; {fix_cols}") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: line 1: not a readable CSV header ({exc}); {fix_cols}") from None
        names = [h.strip().strip('"') for h in header]
        idx: dict[str, int] = {}
        for canon, aliases in _ALIASES.items():
            for i, h in enumerate(names):
                if h in aliases:
                    idx[canon] = i
                    break
        missing = [c for c in INPUT_COLUMNS if c not in idx]
        if missing:
            raise InputError(
                f"{path}: line 1: header {names} lacks column(s) {', '.join(missing)}; {fix_cols} "
                "(one row per sample: container id, Unix seconds, cores used, bytes used)"
            )
        pods: dict[str, list[tuple[float, float, float]]] = {}
        order: list[str] = []
        shift = 0
        first = True
        try:
            for rec in reader:
                line = reader.line_num
                if not rec or (len(rec) == 1 and not rec[0].strip()):
                    continue  # blank line
                if first and len(rec) == len(header) + 1:
                    shift = 1  # unnamed leading index column (pandas to_csv)
                first = False
                need = max(idx.values()) + shift
                if len(rec) <= need:
                    raise InputError(
                        f"{path}: line {line}: {len(rec)} field(s), expected {len(header) + shift}; "
                        "every row needs a value (possibly empty for a missing sample) in every column"
                    )
                get = lambda c: rec[idx[c] + shift].strip()  # noqa: E731
                pod = get("pod_id")
                ts = _parse_number(path, line, "timestamp_seconds", get("timestamp_seconds"), required=True)
                cpu = _parse_number(path, line, "cpu_cores_used", get("cpu_cores_used"), required=False)
                mem = _parse_number(path, line, "memory_bytes_used", get("memory_bytes_used"), required=False)
                if pod not in pods:
                    pods[pod] = []
                    order.append(pod)
                pods[pod].append((ts, cpu, mem))
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: line {reader.line_num}: malformed CSV ({exc}); fix the quoting/encoding of that row") from None
    return pods, order


def _parse_number(path: Path, line: int, column: str, text: str, required: bool) -> float:
    if text == "" and not required:
        return math.nan  # missing sample
    try:
        if "_" in text:
            raise InputError(text)
        v = float(text)
    except ValueError:
        fix = "give Unix seconds as a number" if required else "give a number, or leave the cell empty for a missing sample"
        raise InputError(f"{path}: line {line}, column {column}: {text!r} is not a number; {fix}") from None
    if required and not math.isfinite(v):
        raise InputError(f"{path}: line {line}, column {column}: {text!r} is not a finite timestamp; give Unix seconds")
    return v


def recommend_csv(
    input_path: str | Path,
    output_path: str | Path | None,
    interval: int = 10,
    params: VpaParams = VpaParams(),
) -> pd.DataFrame:
    """Recommendations for every container of a CSV ``pod_id,timestamp_seconds,cpu_cores_used,memory_bytes_used``.

    Containers are processed in order of first appearance, each one's samples sorted by timestamp (stable).
    Writes ``pod_id,timestamp,sample_index,cpu_target,mem_target,cpu_lower,mem_lower,cpu_upper,mem_upper``
    formatted like the harness (Go's shortest float formatting; empty fields where VPA gives nothing) to
    ``output_path`` (skipped if None) and returns the same table as a DataFrame.

    Empty, NaN or negative usage cells are missing samples (the harness reads them the same way); any other
    non-numeric cell, an unparsable timestamp or a missing column is an InputError naming file, line, column.
    The DLaaS column names (``timestamp``, ``pod.id``, ``cpu.usage.cores``, ``mem.current``) are accepted too.
    """
    interval = _check_interval(interval)
    if not isinstance(params, VpaParams):
        raise TypeError(f"params must be a VpaParams, got {type(params).__name__}")
    path = Path(input_path)
    pods, order = _read_traces(path)
    out_rows: list[tuple] = []
    ooms = 0
    for pod in order:
        samples = sorted(pods[pod], key=lambda s: s[0])  # stable, like sort.SliceStable
        arr = np.asarray(samples, dtype=np.float64).reshape(-1, 3)
        rows, n = _trace_rows(arr[:, 0], arr[:, 1], arr[:, 2], interval, params)
        ooms += n
        out_rows.extend((pod, *r) for r in rows)
    df = pd.DataFrame(out_rows, columns=CSV_COLUMNS)
    df["sample_index"] = df["sample_index"].astype(np.int64)
    df.attrs["oom_events"] = ooms
    if output_path is not None:
        lines = [",".join(CSV_COLUMNS)]
        for pod, ts, k, *vals in out_rows:
            lines.append(",".join([pod, _fmt_f(ts), str(k), *(_fmt_g(v) for v in vals)]))
        Path(output_path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return df


# --------------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------------

_DURATION_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """A Go duration (``24h``, ``20m``, ``1200s``, ``1h30m``, ``1.5h``, ``300ms``) in seconds; a bare number is
    taken as seconds."""
    s = text.strip()
    if not s:
        raise InputError("empty duration; write e.g. 24h, 20m or 1200s")
    sign = -1 if s[0] == "-" else 1
    body = s[1:] if s[0] in "+-" else s
    try:
        return float(sign * Fraction(body))  # bare number: seconds
    except (ValueError, ZeroDivisionError):
        pass
    pos, total = 0, Fraction(0)
    for m in _DURATION_PART.finditer(body):
        if m.start() != pos:
            break
        total += Fraction(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(body) or pos == 0:
        raise InputError(f"invalid duration {text!r}; write e.g. 24h, 20m, 1200s or 1h30m (units ns, us, ms, s, m, h)")
    return float(sign * total)


# flag name -> (VpaParams field, kind); harness names first, then VPA recommender's own flag names.
_FLAGS: dict[str, tuple[str, str]] = {
    "step-seconds": ("step_seconds", "float"),
    "cpu-half-life": ("cpu_half_life_s", "duration"),
    "mem-half-life": ("memory_half_life_s", "duration"),
    "mem-interval": ("memory_aggregation_interval_s", "duration"),
    "mem-interval-count": ("memory_aggregation_interval_count", "int"),
    "margin": ("safety_margin_fraction", "float"),
    "min-cpu-millicores": ("pod_min_cpu_millicores", "float"),
    "min-mem-mb": ("pod_min_memory_mb", "float"),
    "target-cpu-percentile": ("target_cpu_percentile", "float"),
    "target-mem-percentile": ("target_memory_percentile", "float"),
    "confidence-interval-cpu": ("confidence_interval_cpu_s", "duration"),
    "confidence-interval-mem": ("confidence_interval_memory_s", "duration"),
    "oom-on-shortfall": ("oom_on_shortfall", "bool"),
    # VPA recommender flag names (aliases)
    "cpu-histogram-decay-half-life": ("cpu_half_life_s", "duration"),
    "memory-histogram-decay-half-life": ("memory_half_life_s", "duration"),
    "memory-aggregation-interval": ("memory_aggregation_interval_s", "duration"),
    "memory-aggregation-interval-count": ("memory_aggregation_interval_count", "int"),
    "recommendation-margin-fraction": ("safety_margin_fraction", "float"),
    "pod-recommendation-min-cpu-millicores": ("pod_min_cpu_millicores", "float"),
    "pod-recommendation-min-memory-mb": ("pod_min_memory_mb", "float"),
    "target-memory-percentile": ("target_memory_percentile", "float"),
    "recommendation-lower-bound-cpu-percentile": ("lower_bound_cpu_percentile", "float"),
    "recommendation-upper-bound-cpu-percentile": ("upper_bound_cpu_percentile", "float"),
    "recommendation-lower-bound-memory-percentile": ("lower_bound_memory_percentile", "float"),
    "recommendation-upper-bound-memory-percentile": ("upper_bound_memory_percentile", "float"),
    "confidence-interval-memory": ("confidence_interval_memory_s", "duration"),
    "oom-bump-up-ratio": ("oom_bump_up_ratio", "float"),
    "oom-min-bump-up-bytes": ("oom_min_bump_up_bytes", "float"),
}
_BOOL_TEXT = {"1": True, "t": True, "T": True, "true": True, "TRUE": True, "True": True,
              "0": False, "f": False, "F": False, "false": False, "FALSE": False, "False": False}


def params_from_flags(argv: Iterable[str], base: VpaParams | None = None) -> VpaParams:
    """VpaParams from the harness's flags (``-step-seconds 10 -cpu-half-life 1200s -mem-half-life 1200s
    -mem-interval 1200s -min-cpu-millicores 0 -min-mem-mb 0 -oom-on-shortfall`` ...), single or double dash,
    ``-flag value`` or ``-flag=value``; the last occurrence wins (as Go's flag package). Durations are Go
    durations (``24h``, ``20m``, ``10s``). VPA's own recommender flag names are accepted as aliases.
    ``-interval`` is not a VPA parameter: pass it to :func:`recommend_trace` / the CLI's ``--interval``.
    """
    args = list(argv)
    values: dict[str, Any] = {}
    i = 0
    known = ", ".join("-" + k for k in _FLAGS)
    while i < len(args):
        tok = args[i]
        if not isinstance(tok, str) or not tok.startswith("-") or tok in ("-", "--"):
            raise InputError(f"unexpected argument {tok!r}: VPA flags look like -name value or -name=value")
        name, eq, inline = tok.lstrip("-").partition("=")
        if name == "interval":
            raise InputError("-interval is not a VPA parameter: pass it as recommend_trace(interval=...) / the CLI's --interval")
        if name not in _FLAGS:
            raise InputError(f"unknown VPA flag {tok!r}; known flags: {known}")
        field_name, kind = _FLAGS[name]
        if kind == "bool":
            if eq:
                if inline not in _BOOL_TEXT:
                    raise InputError(f"flag -{name}: {inline!r} is not a boolean (use -{name} or -{name}=false)")
                values[field_name] = _BOOL_TEXT[inline]
            else:
                values[field_name] = True
            i += 1
            continue
        if eq:
            text = inline
            i += 1
        else:
            if i + 1 >= len(args):
                raise InputError(f"flag -{name} needs a value")
            text = args[i + 1]
            i += 2
        try:
            if kind == "duration":
                values[field_name] = parse_duration(text)
            elif kind == "int":
                values[field_name] = int(text.strip())
            else:
                v = float(text.strip())
                values[field_name] = v
        except ValueError as exc:
            what = {"duration": "a duration such as 24h, 20m or 1200s", "int": "an integer", "float": "a number"}[kind]
            raise InputError(f"flag -{name}: invalid value {text!r}, expected {what} ({exc})") from None
    base = base if base is not None else VpaParams()
    kwargs = {f.name: getattr(base, f.name) for f in fields(base)}
    kwargs.update(values)
    return VpaParams(**kwargs)

"""VPA's histogram machinery (``pkg/recommender/util``) and the Go arithmetic it rests on, ported operation by
operation: exponential buckets, the decaying histogram, Go's time in integer nanoseconds, Go's ``math.Log``,
``Exp2`` and ``Pow``, and resource amounts truncated to int64. What is ported here decides bucket indices,
decay weights and confidence multipliers, so it must be bit-identical to the Go recommender
(``tests/test_vpa.py`` checks the conformance vectors)."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

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

    # -- state, for a store that keeps it between calls (the live stream) --
    def state(self) -> dict:
        """Everything that decides a later answer, as JSON values (the nonzero weights by bucket; floats and
        Python ints exactly): :meth:`restore` gives a histogram that answers as this one would."""
        return {"w": [[b, v] for b, v in enumerate(self.weights) if v != 0.0], "total": self.total,
                "min": self.min_bucket, "max": self.max_bucket, "ref": self.reference_ns, "version": self.version}

    def restore(self, state: dict) -> "_DecayingHistogram":
        self.weights = [0.0] * self.buckets.num_buckets
        for b, v in state["w"]:
            self.weights[int(b)] = float(v)
        self.total, self.min_bucket, self.max_bucket = float(state["total"]), int(state["min"]), int(state["max"])
        self.reference_ns, self.version = int(state["ref"]), int(state["version"])
        self._factor_at = None  # a cache of the decay factor: recomputed, the same number
        return self

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


def _trunc_mod(d: int, m: int) -> int:
    """Go's ``%`` on int64 (sign of the dividend)."""
    r = abs(d) % abs(m)
    return -r if d < 0 else r



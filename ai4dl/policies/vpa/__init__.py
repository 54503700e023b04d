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

from ai4dl.policies.vpa.harness import (
    CSV_COLUMNS,
    INPUT_COLUMNS,
    OUTPUT_COLUMNS,
    params_from_flags,
    recommend_csv,
    recommend_trace,
)
from ai4dl.policies.vpa.recommender import (
    Recommendation,
    VpaParams,
    VpaRecommender,
    cpu_targets,
)

__all__ = [
    "CSV_COLUMNS", "INPUT_COLUMNS", "OUTPUT_COLUMNS", "Recommendation", "VpaParams", "VpaRecommender", "cpu_targets",
    "params_from_flags", "recommend_csv", "recommend_trace",
]

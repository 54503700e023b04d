"""Durations and instants written as text, read one way everywhere.

A duration appears in three places: Prometheus ranges (``--step 10s``, ``now-6h``), the VPA recommender's flags
(Go durations such as ``1200s``, ``1h30m``) and their config keys. One grammar serves all of them: a sequence of
``number unit`` parts with Go's units (``ns``, ``us``/``µs``, ``ms``, ``s``, ``m``, ``h``) and Prometheus's
longer ones (``d``, ``w``), an optional sign, or a bare number of seconds. Every Go duration and every
Prometheus duration a user writes reads the same here as there (Prometheus's ``y`` is left out: a year of
samples is not a range anyone queries in one go). Each caller states the range it accepts (``positive``).

>>> parse_duration("10s"), parse_duration("1h30m"), parse_duration("500ms"), parse_duration("2d"), parse_duration(30)
(10.0, 5400.0, 0.5, 172800.0, 30.0)
>>> parse_duration("-1.5h")
-5400.0
>>> parse_time("2019-08-16T13:30:20Z"), parse_time("1565962220"), parse_time("now-1m", now=1000.0)
(1565962220.0, 1565962220.0, 940.0)
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from fractions import Fraction

from ai4dl.errors import InputError

_UNITS = {
    "ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6), "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600), "d": Fraction(86400),
    "w": Fraction(604800),
}
_PART = re.compile(r"\s*(\d+\.?\d*|\.\d+)\s*(ns|us|µs|μs|ms|s|m|h|d|w)")
_EXAMPLES = "e.g. 10s, 20m, 1h30m, 500ms, 2d"


def parse_duration(text: str | float | int, *, positive: bool = False) -> float:
    """Seconds of a duration (see the module docstring); ``positive``: zero and negative durations are refused.
    Exact arithmetic until the end, so ``1h30m`` is 5400.0, not a sum of rounded parts."""
    s = str(text).strip()
    if not s:
        raise InputError(f"empty duration; write {_EXAMPLES}")
    sign = -1 if s[0] == "-" else 1
    body = s[1:].strip() if s[0] in "+-" else s
    try:
        total = Fraction(body)  # a bare number: seconds
    except (ValueError, ZeroDivisionError):
        pos, total = 0, Fraction(0)
        for m in _PART.finditer(body):
            if m.start() != pos:
                break
            total += Fraction(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(body) or pos == 0:
            raise InputError(f"{text!r} is not a duration ({_EXAMPLES}; units ns, us, ms, s, m, h, d, w)") from None
    seconds = float(sign * total)
    if positive and not seconds > 0:
        raise InputError(f"{text!r} is not a duration above zero ({_EXAMPLES})")
    return seconds


def parse_time(text: str | float | int, now: float | None = None) -> float:
    """Epoch seconds of ``now``, ``now-6h`` (any duration above zero), epoch seconds, or an ISO-8601 time (UTC
    unless it says otherwise)."""
    s = str(text).strip()
    now = time.time() if now is None else now
    m = re.match(r"^now\s*(?:-\s*(.+))?$", s)
    if m:
        return now - (parse_duration(m.group(1), positive=True) if m.group(1) else 0.0)
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"{text!r} is not a time (epoch seconds, ISO-8601 such as 2024-05-01T12:00:00Z, or now-6h)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


__all__ = ["parse_duration", "parse_time"]

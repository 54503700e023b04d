"""Derived features: usage as a share of the container's limits, and short rolling summaries of it.

Why: the raw metrics mostly measure a container's *size* (its limits span 1-16 cores, 2-32 GiB in a fleet),
so k-means on them finds small and large containers, not behaviours; and a 4-step window of levels cannot see
what tells behaviours apart over tens of steps: how much CPU varies, how fast memory moves up and down. These
features are relative to the container's own limits (size drops out) and summarise the last 10-20 steps
(floors, spreads and step changes, log-scaled because they are heavy-tailed), the CPU floor and memory's
movement also over the last 3 and 5 steps, which tell the phases apart better beside the long forms. The default set
(:data:`ai4dl.lake.columns.BEHAVIOUR_FEATURES`) was chosen by an ablation on training containers of one
generated fleet and confirmed on another's (``bench/feature_ablation.py``); the other definitions here are the
candidates that ablation tried, kept so it can be rerun and a user can try them. Memory's movement is the
*median* step change: one level shift at a phase change would lift a mean for ten steps and make the steps
after every change look like a warm-up.

Every feature at step t uses only steps <= t of the same container (and segment, when gaps split a trace),
so batch windows, the live stream and the pyfunc model compute the same numbers: one pandas definition,
:func:`derive`, applied per container everywhere (by :func:`ai4dl.method.windowing.container_windows`).

>>> import pandas as pd
>>> pdf = pd.DataFrame({"cpu_usage_cores": [1.0, 2.0, 1.0], "cpu_num_cores": 4.0,
...                     "mem_current": [1.0, 2.0, 4.0], "mem_limit": 8.0})
>>> out = derive(pdf, ("mem_frac", "cpu_frac_min10", "ln_absd_mem_frac_mean10"))
>>> out["mem_frac"].tolist(), out["cpu_frac_min10"].tolist()
([0.125, 0.25, 0.5], [0.25, 0.25, 0.25])
>>> [round(v, 4) for v in out["ln_absd_mem_frac_mean10"]]  # mean |change| 0, 0.0625, 0.125 -> ln(. + 0.001)
[-6.9078, -2.7567, -2.0715]
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd

from ai4dl.errors import InputError
from ai4dl.lake.columns import BEHAVIOUR_FEATURES, DERIVED_FEATURES

# How many steps back a derived feature looks (its own row included): a window's history needs this many raw
# rows before its oldest step.
LOOKBACK = 20
_EPS = 0.001


def _floats(column: pd.Series) -> np.ndarray:
    """A column as float64 numbers (what is not a number: NaN)."""
    if column.dtype.kind != "f":
        column = pd.to_numeric(column, errors="coerce")
    return column.to_numpy(dtype=np.float64, na_value=np.nan)


def _share(num: str, den: str) -> Callable[[pd.DataFrame], pd.Series]:
    def share(pdf: pd.DataFrame) -> pd.Series:
        d = _floats(pdf[den])
        return pd.Series(_floats(pdf[num]) / np.where(d > 0, d, np.nan))

    return share


SHARES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "cpu_frac": _share("cpu_usage_cores", "cpu_num_cores"),
    "mem_frac": _share("mem_current", "mem_limit"),
}
"""Usage as a share of the limit: what every derived feature is computed from."""


class Shares(dict):
    """One container's :data:`SHARES`, each computed on first use and then reused by every feature built on it."""

    def __init__(self, pdf: pd.DataFrame) -> None:
        super().__init__()
        self.pdf = pdf

    def __missing__(self, name: str) -> pd.Series:
        value = self[name] = SHARES[name](self.pdf)
        return value


def _level(share: str) -> Callable[[Shares], pd.Series]:
    return lambda shares: shares[share]


def _rolling(share: str, w: int, how: str) -> Callable[[Shares], pd.Series]:
    return lambda shares: getattr(shares[share].rolling(w, min_periods=1), how)()


def _range(share: str, w: int) -> Callable[[Shares], pd.Series]:
    def f(shares: Shares) -> pd.Series:
        rolling = shares[share].rolling(w, min_periods=1)
        return rolling.max() - rolling.min()

    return f


def _ln_std(share: str, w: int) -> Callable[[Shares], pd.Series]:
    # sample std (ddof 1) of the known values among the last w steps; 0 while only one is known, NaN with none
    def f(shares: Shares) -> pd.Series:
        rolling = shares[share].rolling(w, min_periods=1)
        known = rolling.count().to_numpy()
        sd = np.where(known > 1, rolling.std(ddof=1).to_numpy(), 0.0)
        return pd.Series(np.log(np.where(known >= 1, sd, np.nan) + _EPS))

    return f


def _changes(share: str, w: int, how: str, absolute: bool = True, log: bool = True) -> Callable[[Shares], pd.Series]:
    # ``how`` (mean, median) of x(t) - x(t-1), or of its absolute value, over the known changes among the last w
    # steps, the first step's change counted as 0; log(. + eps) with ``log``. A median of absolute changes is
    # not moved by one level shift, a mean is lifted by it for w steps.
    def f(shares: Shares) -> pd.Series:
        x = shares[share]
        change = x.diff().abs() if absolute else x.diff()
        if len(change) and pd.notna(x.iloc[0]):
            change.iloc[0] = 0.0
        summary = getattr(change.rolling(w, min_periods=1), how)()
        return np.log(summary + _EPS) if log else summary

    return f


DERIVED: dict[str, Callable[[Shares], pd.Series]] = {
    "cpu_frac": _level("cpu_frac"),
    "mem_frac": _level("mem_frac"),
    "cpu_frac_min10": _rolling("cpu_frac", 10, "min"),
    "ln_cpu_frac_std20": _ln_std("cpu_frac", 20),
    "ln_absd_mem_frac_mean10": _changes("mem_frac", 10, "mean"),
    "ln_absd_cpu_frac_mean10": _changes("cpu_frac", 10, "mean"),
    "cpu_frac_median10": _rolling("cpu_frac", 10, "median"),
    "cpu_frac_max10": _rolling("cpu_frac", 10, "max"),
    "mem_frac_slope10": _changes("mem_frac", 10, "mean", absolute=False, log=False),
    "mem_frac_range20": _range("mem_frac", 20),
    "ln_absd_mem_frac_mean5": _changes("mem_frac", 5, "mean"),
    "ln_cpu_frac_std10": _ln_std("cpu_frac", 10),
    "ln_medd_mem_frac10": _changes("mem_frac", 10, "median"),
    "cpu_frac_min5": _rolling("cpu_frac", 5, "min"),
    "cpu_frac_min3": _rolling("cpu_frac", 3, "min"),
    "ln_cpu_frac_std5": _ln_std("cpu_frac", 5),
    "ln_medd_mem_frac5": _changes("mem_frac", 5, "median"),
    "ln_absd_cpu_frac_mean5": _changes("cpu_frac", 5, "mean"),
}
"""Derived feature -> its definition over one container's shares in time order (a Series aligned with its rows)."""

assert tuple(DERIVED) == DERIVED_FEATURES, "ai4dl.lake.columns.DERIVED_FEATURES names every derived feature"
INPUTS: tuple[str, ...] = ("cpu_usage_cores", "cpu_num_cores", "mem_current", "mem_limit")


def derived_of(features: Sequence[str]) -> tuple[str, ...]:
    """The derived features among ``features``, in their order."""
    return tuple(f for f in features if f in DERIVED)


def derive(pdf: pd.DataFrame, features: Sequence[str]) -> pd.DataFrame:
    """``pdf`` (one container's rows, or one segment's, in time order) with the derived ``features`` added as
    float columns. A step whose limit is zero or unknown gets NaN shares (its window is then not labelled:
    :func:`ai4dl.method.windowing.build_windows`); summaries over the last steps use the known values."""
    wanted = derived_of(features)
    missing = [c for c in INPUTS if c not in pdf.columns] if wanted else []
    if missing:
        raise InputError(f"derived features {list(wanted)} need column(s) {missing}")
    shares = Shares(pdf)
    return pdf.assign(**{name: DERIVED[name](shares).to_numpy(dtype=np.float64) for name in wanted})


def derive_segments(pdf: pd.DataFrame, features: Sequence[str], segment: np.ndarray) -> pd.DataFrame:
    """:func:`derive` over one container's rows in time order, restarted at every new ``segment`` (one id per
    row, :func:`ai4dl.method.windowing.segments`), as windows restart their history there."""
    if not derived_of(features):
        return pdf
    segment = np.asarray(segment)
    cuts = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    if not len(cuts):
        return derive(pdf, features)
    bounds = [0, *cuts.tolist(), len(pdf)]
    return pd.concat([derive(pdf.iloc[a:b], features) for a, b in zip(bounds[:-1], bounds[1:])])


__all__ = ["BEHAVIOUR_FEATURES", "DERIVED", "INPUTS", "LOOKBACK", "derive", "derive_segments", "derived_of"]

"""A policy that looks ahead: a learned forecaster of the coming interval's peak usage, with or without the phase.

The reactive rules assume the coming interval looks like the last one; ``phase.headroom`` adds what usually
follows the current phase. A forecaster learns, from the training containers, how the coming interval's peak
relates to everything known before it, and allocates at a high quantile of that:

``forecast``
    inputs: the last :data:`HISTORY` intervals' max, mean, std and last known usage, each a share of the
    container's limit known at the decision (NaN where an interval is not there yet).
``phase.forecast``
    the same, plus the phase before the interval (one indicator per phase of the model), and how many labelled
    steps it has lasted (``phase_run``). The next-phase probabilities are a function of the phase, which the
    trees already split on, so they are not a separate input.

The target is the *jump* of the peak, ``(max_i - max_{i-1}) / limit``, learned by scikit-learn's
``HistGradientBoostingRegressor`` with the quantile loss twice, at the median and at ``forecast_quantile``, on a
bounded sample of training intervals (trees learn a correction to persistence better than a level). The two
forecasts are read as a normal distribution of the jump, median ``m`` and ``sigma = (upper - m) / z_q``
(``z_q`` the standard normal's ``forecast_quantile``).

**Where to allocate.** A service level is a share of *all* the fleet's steps, so a cheap allocation that
reaches it does not cover every interval to the same quantile: it covers an interval while another unit of
allocation there still buys more met steps than it would elsewhere. With ``lambda``, ``forecast_miss_cost``,
the price of a missed interval in shares of the limit, the allocation at or above the median minimising
``a + lambda * P(miss)`` is where the forecast's density falls to ``1 / lambda``:
``m + sigma * sqrt(2 ln(lambda / (sigma sqrt(2 pi))))``, and the median where the forecast is too wide for any
margin to pay (``sigma sqrt(2 pi) >= lambda``). A sure forecast is covered near its top, an uncertain one is
not chased: the misses a level allows go where covering them costs least per miss avoided. It is a rule of
thumb, not the fleet's exact optimum: prices are in shares of each container's own limit, an interval counts
as one miss however many of its steps are missed, and the normal is only an assumption about the forecasts.
(The earlier rule, ``m + s * (upper - m)``, covered every interval to the same quantile: on three of four
development fleets it saved 0.9-1.3 points of the static allocation less at CPU 99 % of steps met, and from
0.7 points more to 2.1 less at CPU 95 % and memory 95 %; bench/README.md, "the forecasters' miss cost".)
``lambda`` is the family's knob, calibrated on training containers the trees were not fitted on
(:class:`~ai4dl.policies.model.PolicyEstimator`). No previous interval: no decision (the limit).

Fitted trees are exported to plain arrays (:class:`Forecaster`, what the policy model's JSON stores; no pickle)
and evaluated here with numpy (tested equal to scikit-learn's own prediction), so the replay in Spark's Python
workers and the live stream compute each decision with the same function on the same numbers: the replay builds
every interval's inputs at once (:func:`trace_inputs`), the stream keeps the last :data:`HISTORY` interval
summaries and the current phase run (O(1) state) and builds one row with :func:`design`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from ai4dl.errors import ModelError
from ai4dl.policies.rules import blocks, interval_summaries, limit_before, phase_before, phase_codes

FORECASTS: tuple[str, ...] = ("forecast", "phase.forecast")
HISTORY = 3  # intervals of history a forecast reads
SUMMARY = ("max", "mean", "std", "last")  # per interval, what is kept of it
MIN_TRAINING_INTERVALS = 20  # fewer intervals with a known jump: no forecaster (its family allocates the limit)
# the narrowest forecast, as a share of the limit. Where the trees' upper forecast is not above their median
# (quantile trees may cross) they say nothing about the width: the forecast is taken as sure, and the
# allocation sits just above the median (a margin of about 4e-4 of the limit)
MIN_SIGMA = 1e-4
_TREE_FIELDS = ("feature", "threshold", "missing_left", "left", "right", "leaf", "value")


def feature_names(phases: Sequence[int] = ()) -> list[str]:
    """The inputs' names, in the order of :func:`design`'s columns (``phases``: the one-hot phases)."""
    names = [f"{s}_{k}" for k in range(1, HISTORY + 1) for s in SUMMARY]
    if phases:
        names += [f"phase_{int(p)}" for p in phases] + ["phase_run"]
    return names


# ------------------------------------------------------------------------------------------------ inputs


def interval_stats(usage: np.ndarray, length: int) -> np.ndarray:
    """Per interval its max, mean, population std (:func:`~ai4dl.policies.rules.interval_summaries`, what the
    reactive rules read) and last known usage (NaN for an interval without any): shape (intervals, 4), the
    :data:`SUMMARY` the stream keeps of each full interval."""
    usage = np.asarray(usage, dtype=float)
    b = blocks(usage, length)
    known = ~np.isnan(b)
    last_at = np.where(known.any(axis=1), length - 1 - np.argmax(known[:, ::-1], axis=1), 0)
    last = np.where(known.any(axis=1), b[np.arange(len(b)), last_at], np.nan)
    return np.column_stack([*interval_summaries(usage, length), last])


def phase_runs(phases: np.ndarray, length: int) -> np.ndarray:
    """Per interval, how many labelled steps the phase before it has lasted (NaN with no phase yet): unlabelled
    steps neither end nor extend a run, as the stream counts them."""
    codes = phase_codes(phases)
    n_int = -(-len(codes) // length)
    labelled = np.flatnonzero(~np.isnan(codes))
    out = np.full(n_int, np.nan)
    if not len(labelled) or n_int < 2:
        return out
    seq = codes[labelled]
    new_run = np.concatenate([[True], seq[1:] != seq[:-1]])
    starts = np.maximum.accumulate(np.where(new_run, np.arange(len(seq)), 0))
    run = np.arange(len(seq)) - starts + 1  # the run length at each labelled step
    ends = np.arange(1, n_int) * length - 1  # the last step before each interval but the first
    j = np.searchsorted(labelled, ends, side="right") - 1  # the last labelled step at or before it
    out[1:] = np.where(j >= 0, run[np.maximum(j, 0)], np.nan)
    return out


def design(history: np.ndarray, limits: np.ndarray, phase: np.ndarray | None, run: np.ndarray | None,
           phases: Sequence[int] = ()) -> np.ndarray:
    """The forecaster's input rows: ``history`` (rows, :data:`HISTORY`, 4) of the summaries of the intervals
    before (most recent first) divided by each row's known limit, then, with ``phases``, one indicator per phase
    and the phase run. The replay and the stream build their rows with this one function."""
    lim = np.asarray(limits, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.asarray(history, dtype=float) / np.where(lim > 0, lim, np.nan)[:, None, None]
    x = shares.reshape(len(lim), HISTORY * len(SUMMARY))
    if not phases:
        return x
    ph = np.asarray(phase, dtype=float)
    onehot = (ph[:, None] == np.asarray(phases, dtype=float)[None, :]).astype(float)
    return np.column_stack([x, onehot, np.asarray(run, dtype=float)])


def history_of(stats: np.ndarray) -> np.ndarray:
    """Per interval, the summaries of the :data:`HISTORY` intervals before it, most recent first (NaN before the
    first): shape (intervals, HISTORY, 4)."""
    n_int = len(stats)
    out = np.full((n_int, HISTORY, len(SUMMARY)), np.nan)
    for k in range(1, HISTORY + 1):
        if n_int > k:
            out[k:, k - 1, :] = stats[:-k]
    return out


@dataclass(frozen=True)
class TraceInputs:
    """One resource of one container, per interval: the forecaster's input rows, the previous interval's max
    (what a decision adds to), the known limit, and the target (the peak's jump, NaN where unknown)."""

    x: np.ndarray
    prev_max: np.ndarray
    limits: np.ndarray
    target: np.ndarray


def trace_inputs(usage: np.ndarray, lim: np.ndarray, phases: np.ndarray | None, length: int,
                 phase_list: Sequence[int] = ()) -> TraceInputs:
    """Every interval's inputs of one resource's trace (``lim`` per step, filled), at numpy speed."""
    stats = interval_stats(usage, length)
    hist = history_of(stats)
    limits = limit_before(lim, length)
    if phase_list and phases is not None:
        phase, run = phase_before(phases, length), phase_runs(phases, length)
    else:
        phase = run = np.full(len(stats), np.nan)
    x = design(hist, limits, phase, run, phase_list)
    prev_max = hist[:, 0, 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        target = (stats[:, 0] - prev_max) / np.where(limits > 0, limits, np.nan)
    return TraceInputs(x, prev_max, limits, target)


# ------------------------------------------------------------------------------------------- the forecaster


@dataclass(frozen=True, eq=False)
class Trees:
    """Gradient-boosted regression trees as plain arrays: ``baseline + sum of the trees' leaf values`` (the
    learning rate is already in the leaves, as scikit-learn stores them)."""

    baseline: float
    trees: tuple[dict[str, np.ndarray], ...]
    n_features: int

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, quantile: float, max_iter: int = 60, max_leaf_nodes: int = 15,
            seed: int = 0) -> "Trees":
        from sklearn.ensemble import HistGradientBoostingRegressor

        model = HistGradientBoostingRegressor(
            loss="quantile", quantile=float(quantile), max_iter=max_iter, max_leaf_nodes=max_leaf_nodes,
            learning_rate=0.1, min_samples_leaf=40, early_stopping=False, random_state=seed,
        ).fit(x, y)
        return cls.export(model)

    @classmethod
    def export(cls, model: Any) -> "Trees":
        """A fitted ``HistGradientBoostingRegressor`` (numeric features only) as plain arrays."""
        trees = []
        for (predictor,) in model._predictors:  # one tree per iteration for a regressor
            nodes = predictor.nodes
            if nodes["is_categorical"].any():
                raise ModelError("forecaster: categorical splits are not exported")
            trees.append({
                "feature": nodes["feature_idx"].astype(np.int64), "threshold": nodes["num_threshold"].astype(float),
                "missing_left": nodes["missing_go_to_left"].astype(bool), "left": nodes["left"].astype(np.int64),
                "right": nodes["right"].astype(np.int64), "leaf": nodes["is_leaf"].astype(bool),
                "value": nodes["value"].astype(float),
            })
        return cls(float(np.ravel(model._baseline_prediction)[0]), tuple(trees), int(model.n_features_in_))

    @functools.cached_property
    def _forest(self) -> dict[str, np.ndarray]:
        """Every tree's nodes in one flat array per field, children as flat indices, and every leaf its own
        child on both sides: a prediction then walks all trees at once, one pass per level of the deepest,
        and a row that reached its leaf stays there."""
        sizes = [len(t["leaf"]) for t in self.trees]
        if not sizes:  # the baseline alone
            return {"roots": np.zeros(0, dtype=np.int64), "depth": 0}
        start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        flat = {k: np.concatenate([t[k] for t in self.trees]) for k in _TREE_FIELDS}
        own = np.arange(len(flat["leaf"]), dtype=np.int64)
        offset = np.repeat(start, sizes)
        leaf = flat["leaf"]
        left, right = np.where(leaf, own, flat["left"] + offset), np.where(leaf, own, flat["right"] + offset)
        depth, level = 0, start[~leaf[start]]
        while len(level):  # the deepest tree's depth: how many passes take every row to its leaf
            level = np.concatenate([left[level], right[level]])
            level = level[~leaf[level]]
            depth += 1
            if depth > max(sizes):
                raise ModelError("forecaster: a stored tree is malformed (a walk that reaches no leaf)")
        feature = np.where(leaf, 0, flat["feature"])  # a leaf's split feature is never read: any stored value will do
        return {"roots": start, "depth": depth, "feature": feature, "threshold": flat["threshold"],
                "missing_left": flat["missing_left"] | leaf, "left": left, "right": right, "value": flat["value"]}

    def predict(self, x: np.ndarray) -> np.ndarray:
        """One value per row (NaN inputs go where the trees learned missing values go); the leaf values are
        added tree after tree, in the trees' order, as scikit-learn adds them."""
        x = np.asarray(x, dtype=float)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ModelError(f"forecaster: rows of {self.n_features} inputs expected, got shape {x.shape}")
        out = np.full(len(x), self.baseline)
        if not len(x) or not self.trees:
            return out
        f = self._forest
        node = np.repeat(f["roots"][:, None], len(x), axis=1)  # (trees, rows): flat node indices
        rows = np.arange(len(x))[None, :]
        for _ in range(f["depth"]):
            v = x[rows, f["feature"][node]]
            go_left = np.where(np.isnan(v), f["missing_left"][node], v <= f["threshold"][node])
            node = np.where(go_left, f["left"][node], f["right"][node])
        for leaf_values in f["value"][node]:
            out += leaf_values
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "n_features": self.n_features,
                "trees": [{k: t[k].tolist() for k in _TREE_FIELDS} for t in self.trees]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Trees":
        kinds = {"feature": np.int64, "threshold": float, "missing_left": bool, "left": np.int64, "right": np.int64,
                 "leaf": bool, "value": float}
        try:
            trees = tuple({k: np.asarray(t[k], dtype=kinds[k]) for k in _TREE_FIELDS} for t in data["trees"])
            out = cls(float(data["baseline"]), trees, int(data["n_features"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"forecaster: not a stored forecaster ({type(exc).__name__}: {exc})") from None
        for t in out.trees:
            n = len(t["leaf"])
            inner = ~t["leaf"]
            if any(len(t[k]) != n for k in _TREE_FIELDS) or n == 0 or (
                    inner.any() and (t["left"][inner].max() >= n or t["right"][inner].max() >= n
                                     or min(t["left"][inner].min(), t["right"][inner].min()) < 0
                                     or t["feature"][inner].max() >= out.n_features or t["feature"][inner].min() < 0)):
                raise ModelError("forecaster: a stored tree is malformed")
        out._forest  # noqa: B018 - flattened now, so a tree whose walk never reaches a leaf fails here, not later
        return out


@dataclass(frozen=True)
class Forecast:
    """A forecast per interval: the previous max, the median and upper forecast jumps (the upper one at
    ``quantile``), the known limit."""

    prev_max: np.ndarray
    center: np.ndarray
    upper: np.ndarray
    limits: np.ndarray
    quantile: float

    def decisions(self, miss_cost: float) -> np.ndarray:
        """Per interval the allocation at ``miss_cost`` (the module's docstring): a margin over the median that
        shrinks to nothing as the forecast widens, because a miss avoided costs more allocation where the
        forecast is unsure; NaN without a previous max (the limit). The same operations in the replay's grid
        and in the stream."""
        if not 0 < miss_cost < math.inf:
            raise ModelError(f"forecast: the miss cost must be a positive number, got {miss_cost}")
        sigma = np.maximum((self.upper - self.center) / upper_z(self.quantile), MIN_SIGMA)  # NaN stays NaN
        z = np.sqrt(np.maximum(0.0, 2.0 * np.log(float(miss_cost) / (sigma * math.sqrt(2.0 * math.pi)))))
        return self.prev_max + (self.center + z * sigma) * self.limits


def upper_z(quantile: float) -> float:
    """The standard normal's ``quantile``: how many sigmas the upper forecast sits above the median. Only
    ``0.5 < quantile < 1`` gives the forecasts a width."""
    if not 0.5 < quantile < 1:
        raise ModelError(f"forecast: the upper forecast's quantile must be above 0.5 and below 1, got {quantile}")
    return NormalDist().inv_cdf(quantile)


@dataclass(frozen=True, eq=False)
class Forecaster:
    """Two quantile forecasts of the coming peak's jump from the same inputs: the median (``center``) and the
    ``quantile`` (``upper``), which :meth:`Forecast.decisions` reads as a normal distribution.
    ``phases``: the phases it has an indicator for (empty: no phase inputs)."""

    quantile: float
    center: Trees
    upper: Trees
    phases: tuple[int, ...] = ()
    rows: int = 0  # the training intervals it was fitted on

    @property
    def n_features(self) -> int:
        return self.center.n_features

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, quantile: float, phases: Sequence[int] = (), seed: int = 0) -> "Forecaster":
        """Fit on rows ``x`` (from :func:`design`) and jumps ``y`` (rows with an unknown jump are left out)."""
        upper_z(quantile)  # a quantile that gives no width fails here, before any tree is fitted
        keep = np.isfinite(y)
        x, y = np.asarray(x, dtype=float)[keep], np.asarray(y, dtype=float)[keep]
        if len(y) < MIN_TRAINING_INTERVALS:
            raise ModelError(f"forecaster: {len(y)} training intervals with a known jump; too few to learn from "
                             f"(at least {MIN_TRAINING_INTERVALS})")
        return cls(float(quantile), Trees.fit(x, y, 0.5, seed=seed), Trees.fit(x, y, quantile, seed=seed),
                   tuple(int(p) for p in phases), int(len(y)))

    def forecast(self, inputs: TraceInputs) -> Forecast:
        center, upper = np.full(len(inputs.prev_max), np.nan), np.full(len(inputs.prev_max), np.nan)
        at = ~np.isnan(inputs.prev_max)
        if at.any():
            center[at], upper[at] = self.center.predict(inputs.x[at]), self.upper.predict(inputs.x[at])
        return Forecast(inputs.prev_max, center, upper, inputs.limits, self.quantile)

    def as_dict(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "phases": list(self.phases), "rows": self.rows,
                "center": self.center.as_dict(), "upper": self.upper.as_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Forecaster":
        try:
            fc = cls(float(data["quantile"]), Trees.from_dict(data["center"]), Trees.from_dict(data["upper"]),
                     tuple(int(p) for p in data["phases"]), int(data.get("rows", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"forecaster: not a stored forecaster ({type(exc).__name__}: {exc})") from None
        if fc.center.n_features != fc.upper.n_features:
            raise ModelError("forecaster: its two forecasts read different inputs")
        upper_z(fc.quantile)
        return fc


def forecast_of(forecaster: Forecaster | None, usage: np.ndarray, lim: np.ndarray, phases: np.ndarray | None,
                length: int) -> Forecast | None:
    """A forecaster's forecast for every interval of one resource's trace (None without a forecaster)."""
    if forecaster is None:
        return None
    return forecaster.forecast(trace_inputs(usage, lim, phases, length, forecaster.phases))


def forecast_decisions(forecaster: Forecaster | None, usage: np.ndarray, lim: np.ndarray, phases: np.ndarray | None,
                       length: int, miss_cost: float) -> np.ndarray:
    """A forecast family's decision per interval of one resource's trace (NaN everywhere without a forecaster:
    the limit)."""
    fc = forecast_of(forecaster, usage, lim, phases, length)
    return np.full(-(-len(usage) // length), math.nan) if fc is None else fc.decisions(miss_cost)


__all__ = ["FORECASTS", "HISTORY", "MIN_SIGMA", "MIN_TRAINING_INTERVALS", "SUMMARY", "Forecast", "Forecaster", "TraceInputs", "Trees", "design", "feature_names",
           "forecast_decisions", "forecast_of", "history_of", "interval_stats", "phase_runs", "trace_inputs", "upper_z"]

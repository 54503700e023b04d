"""The forecaster policies' trees: exported without pickle, they predict what scikit-learn predicts; their inputs
are what the stream can know before an interval."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from ai4dl.config import load_config
from ai4dl.errors import ConfigError, ModelError
from ai4dl.policies.forecast import (
    HISTORY,
    Forecast,
    Forecaster,
    Trees,
    design,
    feature_names,
    history_of,
    interval_stats,
    phase_runs,
    trace_inputs,
)


def _rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((n, 15))
    x[rng.random(x.shape) < 0.1] = np.nan  # missing history: the trees learn where NaN goes
    y = np.nan_to_num(x[:, 0]) * 0.3 - 0.1 + rng.normal(0, 0.05, n) + (x[:, 12] > 0.5) * 0.2
    return x, y


def test_exported_trees_predict_what_scikit_learn_predicts():
    from sklearn.ensemble import HistGradientBoostingRegressor

    x, y = _rows(3000)
    model = HistGradientBoostingRegressor(loss="quantile", quantile=0.9, max_iter=30, max_leaf_nodes=15,
                                          min_samples_leaf=40, early_stopping=False, random_state=0).fit(x, y)
    trees = Trees.export(model)
    probe, _ = _rows(500, seed=1)
    np.testing.assert_allclose(trees.predict(probe), model.predict(probe), rtol=0, atol=1e-12)
    fc = Forecaster.fit(x, y, 0.9, (0, 1))
    again = Forecaster.from_dict(json.loads(json.dumps(fc.as_dict())))  # what the policy model's JSON holds
    assert np.array_equal(again.upper.predict(probe), fc.upper.predict(probe))
    assert np.array_equal(again.center.predict(probe), fc.center.predict(probe))
    assert again.phases == (0, 1) and again.quantile == 0.9 and again.n_features == 15


def test_quantile_forecasts_cover_about_their_quantiles():
    x, y = _rows(4000)
    fc = Forecaster.fit(x, y, 0.9)
    probe, truth = _rows(4000, seed=2)
    assert 0.85 <= float(np.mean(truth <= fc.upper.predict(probe))) <= 0.95
    assert 0.45 <= float(np.mean(truth <= fc.center.predict(probe))) <= 0.55


def test_a_decision_is_where_a_miss_stops_paying_for_the_allocation_that_avoids_it():
    inputs = trace_inputs(np.array([1.0, 2, 3, 4, 5, 6]), np.full(6, 10.0), None, 2)  # interval maxes 2, 4, 6
    for quantile in (0.9, 0.75):
        one = Forecaster(quantile, Trees(0.1, (), 12), Trees(0.3, (), 12))  # constant forecasts: median 0.1, upper 0.3
        f = one.forecast(inputs)
        z_upper = NormalDist().inv_cdf(quantile)
        sigma = 0.2 / z_upper
        # too wide a forecast for the price: the median; no previous interval: no decision (the limit)
        cheap = f.decisions(0.99 * sigma * math.sqrt(2 * math.pi))
        assert np.isnan(cheap[0]) and cheap[1:].tolist() == pytest.approx([3.0, 5.0])
        # at the price where the forecast's density at its upper quantile is 1 / price: the upper forecast
        at_upper = sigma * math.sqrt(2 * math.pi) * math.exp(z_upper ** 2 / 2)
        assert f.decisions(at_upper)[1:].tolist() == pytest.approx([5.0, 7.0])
        # any price: of the allocations at or above the median, the one minimising allocation + price * P(miss)
        # under the normal the two forecasts describe (a brute-force search over a wide range of jumps)
        normal = NormalDist(0.1, sigma)
        jumps = np.linspace(0.1, 3.0, 29_001)
        miss = 1 - np.array([normal.cdf(j) for j in jumps])
        for price in (0.3, 0.5, 1.0, 3.0, 20.0, 1e4):
            cost = jumps + price * miss
            assert f.decisions(price)[1] == pytest.approx(2.0 + jumps[np.argmin(cost)] * 10, abs=2e-3)
        prices = np.geomspace(0.01, 100, 30)
        assert np.all(np.diff([f.decisions(p)[1] for p in prices]) >= 0)  # a dearer miss never allocates less
    # at one price, a wider forecast gets no more margin once it is past the width where margins stop paying
    base = trace_inputs(np.array([1.0, 2, 3, 4]), np.full(4, 10.0), None, 2)
    margins = [Forecaster(0.9, Trees(0.0, (), 12), Trees(w, (), 12)).forecast(base).decisions(1.0)[1] - 2.0
               for w in (0.05, 0.2, 0.4, 0.8, 1.6)]
    assert margins[-1] == margins[-2] == 0.0 and max(margins) > 0
    # upper below the median (quantile trees may cross): taken as sure, just above the median
    crossed = Forecaster(0.9, Trees(0.2, (), 12), Trees(0.1, (), 12)).forecast(inputs).decisions(5.0)
    assert 4.0 <= crossed[1] <= 4.0 + 0.01
    # a forecast the trees could not make (NaN) is no decision: the limit, whatever the price
    nan_fc = Forecast(np.array([2.0]), np.array([math.nan]), np.array([0.3]), np.array([10.0]), 0.9)
    assert np.isnan(nan_fc.decisions(1.0)[0])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ModelError, match="miss cost"):
            one.forecast(inputs).decisions(bad)


def test_a_forecaster_needs_an_upper_quantile_that_gives_its_forecasts_a_width():
    x, y = _rows(500)
    for quantile in (0.5, 1.0):
        with pytest.raises(ModelError, match="above 0.5 and below 1"):
            Forecaster.fit(x, y, quantile)
    stored = Forecaster.fit(x, y, 0.9).as_dict()
    stored["quantile"] = 1.0
    with pytest.raises(ModelError, match="above 0.5 and below 1"):
        Forecaster.from_dict(stored)
    with pytest.raises(ConfigError):
        load_config(None, ["policies.forecast_quantile=1.0"])


def test_bad_stored_forecasters_are_one_error():
    fc = Forecaster.fit(*_rows(500), 0.9)
    data = fc.as_dict()
    data["upper"]["trees"][0]["left"][0] = 10_000
    with pytest.raises(ModelError, match="malformed"):
        Forecaster.from_dict(data)
    for field, value in (("left", -1), ("right", 0)):  # a negative child; a child that is its own root: a cycle
        bad = fc.as_dict()
        root = bad["upper"]["trees"][0]
        assert not root["leaf"][0]
        root[field][0] = value
        with pytest.raises(ModelError, match="malformed"):
            Forecaster.from_dict(bad)
    odd = fc.as_dict()  # a leaf's feature is never read: any value loads and predicts the same
    tree = odd["upper"]["trees"][0]
    tree["feature"] = [f if not leaf else 999 for f, leaf in zip(tree["feature"], tree["leaf"])]
    probe, _ = _rows(50, seed=2)
    assert np.array_equal(Forecaster.from_dict(odd).upper.predict(probe), fc.upper.predict(probe))
    with pytest.raises(ModelError, match="not a stored forecaster"):
        Forecaster.from_dict({"quantile": 0.5})
    with pytest.raises(ModelError, match="rows of 15 inputs"):
        fc.center.predict(np.zeros((2, 3)))
    with pytest.raises(ModelError, match="too few"):
        Forecaster.fit(np.zeros((5, 3)), np.zeros(5), 0.9)


def test_inputs_are_what_is_known_before_each_interval():
    usage = np.array([1.0, 3, 2, np.nan, 5, 4, 6, 6, np.nan])  # intervals of 3: [1,3,2] [nan,5,4] [6,6,nan]
    stats = interval_stats(usage, 3)
    assert stats[:, 0].tolist() == [3, 5, 6] and stats[:, 3].tolist() == [2, 4, 6]  # max, last known
    hist = history_of(stats)
    assert np.isnan(hist[0]).all() and hist[2, 0, 0] == 5 and hist[2, 1, 0] == 3 and np.isnan(hist[2, 2]).all()
    phases = np.array([0, 0, 1, 1, np.nan, 1, 0, 0, 0], dtype=float)
    assert phase_runs(phases, 3)[1:].tolist() == [1, 3]  # unlabelled steps neither end nor extend a run
    inputs = trace_inputs(usage, np.full(9, 10.0), phases, 3, (0, 1))
    assert inputs.x.shape == (3, len(feature_names((0, 1))))
    assert inputs.prev_max[2] == 5 and inputs.target[2] == pytest.approx(0.1)
    assert inputs.x[2, :4].tolist() == pytest.approx([0.5, 0.45, 0.05, 0.4])  # shares of the limit
    assert inputs.x[2, -3:].tolist() == [0, 1, 3]  # phase 1, lasted 3 labelled steps
    assert design(hist, np.full(3, 10.0), None, None).shape == (3, HISTORY * 4)

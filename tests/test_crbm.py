"""CRBM: CD-k against a hand-written numpy reference, numpy encoding, seeded training, input errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from ai4dl.method.crbm import CRBM, CRBMWeights, encode, train_crbm

V, H, N, ROWS = 3, 2, 2, 5


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The matrices here are tiny; on a busy machine intra-op threads spin-wait on each other and a CD
    # step slows from ~0.5 ms to >10 ms. One thread keeps the file fast; the previous count is restored.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _tiny_weights() -> CRBMWeights:
    rng = np.random.default_rng(42)
    return CRBMWeights(
        W=rng.normal(0, 0.5, (H, V)),
        B=rng.normal(0, 0.5, (H, V * N)),
        A=rng.normal(0, 0.3, (V, V * N)),
        v_bias=rng.normal(0, 0.1, V),
        h_bias=rng.normal(0, 0.1, H),
    )


def _tiny_batch():
    rng = np.random.default_rng(7)
    return rng.normal(size=(ROWS, V)), rng.normal(size=(ROWS, V * N))


def _numpy_cd(w: CRBMWeights, v: np.ndarray, cond: np.ndarray, k: int):
    """CD-k written row by row with explicit sums, independent of the vectorised implementation."""
    n = v.shape[0]

    def h_mean(vr, cr):
        out = np.empty(H)
        for j in range(H):
            z = w.h_bias[j]
            z += sum(w.W[j, i] * vr[i] for i in range(V))
            z += sum(w.B[j, c] * cr[c] for c in range(V * N))
            out[j] = _sigmoid(z)
        return out

    def v_mean(hr, cr):
        out = np.empty(V)
        for i in range(V):
            out[i] = w.v_bias[i]
            out[i] += sum(w.W[j, i] * hr[j] for j in range(H))
            out[i] += sum(w.A[i, c] * cr[c] for c in range(V * N))
        return out

    g = {key: np.zeros_like(val) for key, val in w.as_dict().items()}
    err = 0.0
    for r in range(n):
        vp, cr = v[r], cond[r]
        hp = h_mean(vp, cr)
        vn = v_mean(hp, cr)
        hn = h_mean(vn, cr)
        for _ in range(k - 1):
            vn = v_mean(hn, cr)
            hn = h_mean(vn, cr)
        g["W"] += np.outer(hp, vp) - np.outer(hn, vn)
        g["B"] += np.outer(hp - hn, cr)
        g["A"] += np.outer(vp - vn, cr)
        g["v_bias"] += vp - vn
        g["h_bias"] += hp - hn
        err += float(np.sum((vp - vn) ** 2))
    return {key: val / n for key, val in g.items()}, err / n


def _model(w: CRBMWeights) -> CRBM:
    return CRBM.from_weights(w, dtype=torch.float64)


def _t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


@pytest.mark.parametrize("k", [1, 2])
def test_cd_gradients_match_numpy_reference(k):
    w = _tiny_weights()
    v, cond = _tiny_batch()
    expected, expected_err = _numpy_cd(w, v, cond, k)
    grads, err = _model(w).cd_gradients(_t(v), _t(cond), k=k)
    assert set(grads) == {"W", "B", "A", "v_bias", "h_bias"}
    for key, val in expected.items():
        np.testing.assert_allclose(grads[key].numpy(), val, atol=1e-6, rtol=0, err_msg=key)
    assert err == pytest.approx(expected_err, abs=1e-6)


def test_cd_step_applies_gradient_ascent():
    w = _tiny_weights()
    v, cond = _tiny_batch()
    lr = 0.05
    expected, expected_err = _numpy_cd(w, v, cond, 1)
    model = _model(w)
    err = model.cd_step(_t(v), _t(cond), lr, k=1)
    assert err == pytest.approx(expected_err, abs=1e-6)
    updated = model.weights()
    for key, val in w.as_dict().items():
        np.testing.assert_allclose(getattr(updated, key), val + lr * expected[key], atol=1e-6, rtol=0, err_msg=key)


def test_sample_hidden_is_seeded_and_differs_from_mean_field():
    w = _tiny_weights()
    v, cond = _tiny_batch()
    g1, _ = _model(w).cd_gradients(_t(v), _t(cond), sample_hidden=True)
    g2, _ = _model(w).cd_gradients(_t(v), _t(cond), sample_hidden=True)
    g_mf, _ = _model(w).cd_gradients(_t(v), _t(cond))
    assert torch.equal(g1["W"], g2["W"])
    assert not torch.allclose(g1["W"], g_mf["W"])


def test_encode_equals_hidden_mean():
    rng = np.random.default_rng(3)
    model = CRBM(5, n_hidden=7, n_history=3, seed=11, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.7)
    x, cond = rng.normal(size=(200, 5)), rng.normal(size=(200, 15))
    got = encode(model.weights(), x, cond)
    assert got.dtype == np.float64 and got.shape == (200, 7)
    np.testing.assert_allclose(got, model.hidden_mean(_t(x), _t(cond)).numpy(), atol=1e-12, rtol=0)


def test_encode_is_stable_for_extreme_inputs():
    w = CRBMWeights(
        W=np.ones((1, 1)), B=np.zeros((1, 1)), A=np.zeros((1, 1)), v_bias=np.zeros(1), h_bias=np.zeros(1)
    )
    x = np.array([[-1e4], [0.0], [1e4]])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out = encode(w, x, np.zeros((3, 1)))
    np.testing.assert_allclose(out[:, 0], [0.0, 0.5, 1.0])


def test_encode_needs_no_torch():
    code = (
        "import sys, numpy as np\n"
        "from ai4dl.method.crbm import CRBMWeights, encode\n"
        "w = CRBMWeights(W=np.ones((2, 1)), B=np.ones((2, 3)), A=np.ones((1, 3)), v_bias=np.zeros(1), h_bias=np.zeros(2))\n"
        "encode(w, np.ones((4, 1)), np.ones((4, 3)))\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_weights_roundtrip_and_shapes():
    model = CRBM(4, n_hidden=6, n_history=3, seed=5)
    w = model.weights()
    assert (w.n_visible, w.n_hidden, w.n_history) == (4, 6, 3)
    assert w.B.shape == (6, 12) and w.A.shape == (4, 12)
    assert all(a.dtype == np.float64 for a in w.as_dict().values())
    assert not np.any(w.v_bias) and not np.any(w.h_bias)
    again = CRBMWeights.from_dict(w.as_dict())
    back = CRBM.from_weights(again).weights()
    for key, val in w.as_dict().items():
        np.testing.assert_array_equal(getattr(back, key), val)
    # Same seed, same initialisation; a different seed, different weights.
    np.testing.assert_array_equal(CRBM(4, 6, 3, seed=5).weights().W, w.W)
    assert not np.array_equal(CRBM(4, 6, 3, seed=6).weights().W, w.W)


def _two_regime_data(n_steps=1500, seed=0):
    """A 3-feature trace that switches between a low and a high regime; windows of N=3 steps."""
    rng = np.random.default_rng(seed)
    means = np.array([[-1.0, -0.5, 0.0], [1.0, 1.5, -1.0]])
    regime = (np.arange(n_steps) // 50) % 2
    trace = means[regime] + 0.3 * rng.normal(size=(n_steps, 3))
    n_hist = 3
    x = trace[n_hist:]
    cond = np.stack([trace[i : i + n_hist].reshape(-1) for i in range(len(trace) - n_hist)])
    return x, cond


def test_training_is_reproducible_and_learns():
    x, cond = _two_regime_data()
    kw = dict(n_hidden=4, epochs=15, batch_size=64, learning_rate=0.05, patience=50, seed=9, device="cpu", log=None)
    r1 = train_crbm(x, cond, **kw)
    r2 = train_crbm(x, cond, **kw)
    assert r1.epochs_run == 15 and not r1.stopped_early and r1.device == "cpu"
    assert r1.epoch_errors == r2.epoch_errors
    for key, val in r1.weights.as_dict().items():
        np.testing.assert_array_equal(getattr(r2.weights, key), val)
    assert r1.weights.n_history == 3
    untrained = CRBM(3, n_hidden=4, n_history=3, seed=9, dtype=torch.float64)
    _, initial_err = untrained.cd_gradients(_t(x), _t(cond))
    assert r1.epoch_errors[-1] < r1.epoch_errors[0]
    _, final_err = CRBM.from_weights(r1.weights, dtype=torch.float64).cd_gradients(_t(x), _t(cond))
    assert final_err < 0.25 * initial_err
    r3 = train_crbm(x, cond, **{**kw, "seed": 10})
    assert not np.array_equal(r3.weights.W, r1.weights.W)


def test_early_stopping_keeps_best_epoch():
    x, cond = _two_regime_data(400)
    lines: list[str] = []
    kw = dict(n_hidden=3, batch_size=64, learning_rate=0.05, seed=1, device="cpu")
    # No epoch can beat the first by 1e6, so training stops after 1 + patience epochs.
    r = train_crbm(x, cond, epochs=50, patience=2, min_delta=1e6, log=lines.append, **kw)
    assert r.stopped_early and r.epochs_run == 3 and len(r.epoch_errors) == 3
    assert len(lines) == 3 and lines[0].startswith("epoch   1")
    first_only = train_crbm(x, cond, epochs=1, log=None, **kw)
    np.testing.assert_array_equal(r.weights.W, first_only.weights.W)


def test_a_terminal_gets_the_bar_and_a_log_gets_plain_lines():
    x, cond = _two_regime_data(200)
    kw = dict(n_hidden=3, epochs=3, batch_size=64, seed=1, device="cpu")
    plain: list[str] = []
    train_crbm(x, cond, progress=False, log=plain.append, **kw)
    assert [line.split()[:2] for line in plain] == [["epoch", "1"], ["epoch", "2"], ["epoch", "3"]]
    with_bar: list[str] = []
    train_crbm(x, cond, progress=True, log=with_bar.append, **kw)
    assert not any(line.startswith("epoch") for line in with_bar)  # the bar says it; no second copy per epoch


def test_progress_flag_does_not_change_results():
    x, cond = _two_regime_data(300)
    kw = dict(n_hidden=3, epochs=2, seed=4, device="cpu", log=None)
    quiet = train_crbm(x, cond, progress=False, **kw)
    loud = train_crbm(x, cond, progress=True, **kw)  # a tqdm bar, or a log line if tqdm is missing
    np.testing.assert_array_equal(quiet.weights.W, loud.weights.W)


@pytest.mark.parametrize(
    "x, cond, match",
    [
        (np.zeros((10, 3)), np.zeros((9, 9)), "rows"),
        (np.zeros((10, 3)), np.zeros((10, 8)), "multiple"),
        (np.zeros((0, 3)), np.zeros((0, 9)), "no training rows"),
        (np.zeros(10), np.zeros((10, 9)), "2-D"),
        (
            np.array([[0.0, 0.0, 0.0]] * 3 + [[0.0, np.nan, 0.0]]),
            np.zeros((4, 9)),
            r"x has 1 non-finite values \(first in row 3\)",
        ),
        (np.zeros((4, 3)), np.full((4, 9), np.inf), "cond has 36 non-finite"),
    ],
)
def test_train_rejects_bad_input(x, cond, match):
    with pytest.raises(ValueError, match=match):
        train_crbm(x, cond, epochs=1, device="cpu", log=None)


def test_encode_rejects_bad_shapes():
    w = CRBM(3, n_hidden=2, n_history=2).weights()
    with pytest.raises(ValueError, match="x must have shape"):
        encode(w, np.zeros((4, 2)), np.zeros((4, 6)))
    with pytest.raises(ValueError, match="cond must have shape"):
        encode(w, np.zeros((4, 3)), np.zeros((4, 9)))
    with pytest.raises(ValueError, match="rows"):
        encode(w, np.zeros((4, 3)), np.zeros((5, 6)))


def test_weights_reject_inconsistent_shapes():
    ok = dict(W=np.zeros((2, 3)), B=np.zeros((2, 6)), A=np.zeros((3, 6)), v_bias=np.zeros(3), h_bias=np.zeros(2))
    CRBMWeights(**ok)
    for key, bad, match in [
        ("A", np.zeros((3, 9)), r"A must have shape \(3, 6\)"),
        ("B", np.zeros((2, 7)), "not a multiple"),
        ("B", np.zeros((3, 6)), "B must have shape"),
        ("v_bias", np.zeros(2), r"v_bias must have shape \(3,\)"),
        ("h_bias", np.zeros(3), r"h_bias must have shape \(2,\)"),
        ("W", np.zeros(3), "W must be 2-D"),
        ("W", np.full((2, 3), np.nan), "W contains non-finite"),
    ]:
        with pytest.raises(ValueError, match=match):
            CRBMWeights(**{**ok, key: bad})
    with pytest.raises(ValueError, match="missing"):
        CRBMWeights.from_dict({k: v for k, v in ok.items() if k != "A"})
    w = CRBMWeights(**ok)
    assert not w.W.flags.writeable

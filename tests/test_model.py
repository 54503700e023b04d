"""Model directories: bit-for-bit round trip, versions, and clear refusals of damaged or mismatched models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ai4dl.method.crbm import CRBMWeights
from ai4dl.method.labelling import assign, check_compatible
from ai4dl.method.model import ModelError, PhaseModel, latest_version, load, save, save_version, versions
from ai4dl.method.scaler import Scaler

FEATURES = ("cpu_usage_cores", "mem_current", "mem_working_set")


def make_model(seed: int = 0, k: int = 3) -> PhaseModel:
    rng = np.random.default_rng(seed)
    v, h, n = len(FEATURES), 4, 2
    weights = CRBMWeights(W=rng.normal(size=(h, v)), B=rng.normal(size=(h, v * n)), A=rng.normal(size=(v, v * n)),
                          v_bias=rng.normal(size=v), h_bias=rng.normal(size=h))
    scaler = Scaler(FEATURES, tuple(rng.normal(size=v)), tuple(rng.uniform(1, 2, size=v)))
    return PhaseModel(scaler, weights, rng.uniform(size=(k, h)), info={"note": "test"})


def test_round_trip_is_bit_for_bit(tmp_path):
    model = make_model()
    loaded = load(save(model, tmp_path / "m"))
    for key, arr in model.arrays().items():
        assert np.array_equal(arr, loaded.arrays()[key]) and arr.dtype == loaded.arrays()[key].dtype
    assert loaded.scaler == model.scaler and loaded.model_id == model.model_id
    assert loaded.info["note"] == "test"
    assert not list(tmp_path.glob("*.pickle")) and not list((tmp_path / "m").glob("*.pkl"))


def test_versions_are_immutable_and_deduplicated(tmp_path):
    a, b = make_model(0), make_model(1)
    p1 = save_version(a, tmp_path, "m")
    assert save_version(a, tmp_path, "m") == p1  # same numbers: no new version
    p2 = save_version(b, tmp_path, "m")
    assert [p.name for p in versions(tmp_path, "m")] == ["v0001", "v0002"] and latest_version(tmp_path, "m") == p2
    with pytest.raises(ModelError, match="already exists"):
        save(a, p1)


def test_refinement_round_trip(tmp_path):
    m = make_model()
    sub = np.random.default_rng(3).uniform(size=(2, 4))
    refined = PhaseModel(m.scaler, m.crbm, m.centers, {1: (sub, (1, 3))})
    loaded = load(save(refined, tmp_path / "r"))
    assert loaded.refinements[1][1] == (1, 3) and np.array_equal(loaded.refinements[1][0], sub)
    assert loaded.phase_ids == [0, 1, 2, 3]


def test_refinement_keeps_other_phases():
    m = make_model(k=3)
    h = np.random.default_rng(5).uniform(size=(500, 4))
    before, _ = assign(m.centers, {}, h)
    after, _ = assign(m.centers, {1: (np.random.default_rng(6).uniform(size=(2, 4)), (1, 3))}, h)
    unchanged = before != 1
    assert np.array_equal(before[unchanged], after[unchanged])
    assert set(after[~unchanged]) <= {1, 3}


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda d: (d / "weights.safetensors").unlink(), "weights.safetensors: missing"),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
        (lambda d: (d / "weights.safetensors").write_bytes((d / "weights.safetensors").read_bytes()[:-16]), "checksum mismatch"),
        (lambda d: (d / "scaler.json").write_text((d / "scaler.json").read_text().replace("cpu", "gpu")), "checksum mismatch"),
        (lambda d: (d / "manifest.json").write_text("{not json"), "not valid JSON"),
    ],
)
def test_damaged_model_directories_are_refused(tmp_path, damage, message):
    d = save(make_model(), tmp_path / "m")
    damage(d)
    with pytest.raises(ModelError, match=message):
        load(d)


def test_wrong_shapes_are_refused(tmp_path):
    from safetensors.numpy import save_file

    d = save(make_model(), tmp_path / "m")
    arrays = make_model().arrays()
    arrays["centers"] = np.zeros((3, 7))
    save_file(arrays, str(d / "weights.safetensors"))
    manifest = json.loads((d / "manifest.json").read_text())
    import hashlib

    manifest["files"]["weights.safetensors"] = hashlib.sha256((d / "weights.safetensors").read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match=r"centres must have shape \(k, 4\)"):
        load(d)
    with pytest.raises(ModelError, match="does not exist"):
        load(tmp_path / "nowhere")


def test_model_table_mismatch_is_refused():
    m = make_model()
    check_compatible(m, FEATURES, 2, m.scaler.digest)
    with pytest.raises(ModelError, match="features"):
        check_compatible(m, ("cpu_usage_cores", "mem_current"), 2, None)
    with pytest.raises(ModelError, match="n_history 2"):
        check_compatible(m, FEATURES, 3, None)
    with pytest.raises(ModelError, match="another scaler"):
        check_compatible(m, FEATURES, 2, "0123456789abcdef")

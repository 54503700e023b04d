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


def make_classifier(seed: int = 0, n: int = 4, k: int = 3, units: int = 5):
    from ai4dl.method.classifier import PhaseClassifier

    rng = np.random.default_rng(seed)
    return PhaseClassifier(rng.normal(size=n), rng.uniform(0.5, 2, size=n), rng.normal(size=(units, n)),
                           rng.normal(size=units), rng.normal(size=(k, units)), rng.normal(size=k))


def test_a_phase_classifier_round_trips_and_is_part_of_the_model_id(tmp_path):
    import dataclasses

    bare = make_model()
    model = dataclasses.replace(bare, classifier=make_classifier())
    loaded = load(save(model, tmp_path / "m"))
    h = np.random.default_rng(1).normal(size=(7, 4))
    assert np.array_equal(loaded.classifier.costs(h), model.classifier.costs(h))
    assert loaded.model_id == model.model_id != bare.model_id
    assert load(save(bare, tmp_path / "b")).classifier is None
    costs = model.classifier.costs(h)  # -log p: each row's probabilities sum to one
    np.testing.assert_allclose(np.exp(-costs).sum(axis=1), 1.0, rtol=1e-12)


def test_a_classifier_that_does_not_fit_the_model_or_its_manifest_is_refused(tmp_path):
    import dataclasses

    from safetensors.numpy import load_file, save_file

    base = make_model()
    with pytest.raises(ModelError, match="does not fit"):
        dataclasses.replace(base, classifier=make_classifier(k=4))  # 3 phases
    with pytest.raises(ModelError, match="does not fit"):
        dataclasses.replace(base, classifier=make_classifier(n=5))  # 4 hidden units
    with pytest.raises(ModelError, match="finite"):
        c = make_classifier()
        type(c)(c.mean, np.zeros_like(c.scale), c.W1, c.b1, c.W2, c.b2)
    d = save(dataclasses.replace(base, classifier=make_classifier()), tmp_path / "m")
    arrays = load_file(str(d / "weights.safetensors"))
    del arrays["classifier_W2"]
    save_file(arrays, str(d / "weights.safetensors"))
    manifest = json.loads((d / "manifest.json").read_text())
    import hashlib

    manifest["files"]["weights.safetensors"] = hashlib.sha256((d / "weights.safetensors").read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="classifier_W2"):
        load(d)


def test_the_classifier_learns_the_phases_it_is_given_and_the_decoders_read_it():
    """fit_classifier learns per-step targets from activations (here: which half-space a point is in, the kind
    of partition Viterbi's labels draw), and a model carrying it is decoded from its costs, not distances."""
    import dataclasses

    from ai4dl.method.classifier import fit_classifier
    from ai4dl.method.labelling import decode_path, label_batch, step_costs, switch_cost

    rng = np.random.default_rng(0)
    h = rng.normal(size=(3000, 4))
    targets = (h[:, 0] + 0.5 * h[:, 1] > 0).astype(int) + (h[:, 2] > 1.2)
    clf = fit_classifier(h, targets, 3, units=16, epochs=150, seed=1)
    assert np.mean(np.argmin(clf.costs(h), axis=1) == targets) > 0.95
    model = dataclasses.replace(make_model(), classifier=clf)
    assert switch_cost(model, "forward") == 0.25 and switch_cost(model, "viterbi") == 10.0  # nats
    d2, costs = step_costs(model.centers, model.classifier, h[:50])
    path, dist = decode_path(d2, "none", 0.0, costs)
    assert path.tolist() == np.argmin(costs, axis=1).tolist() != np.argmin(d2, axis=1).tolist()
    np.testing.assert_allclose(dist, np.sqrt(d2[np.arange(50), path]))  # still the distance to the phase's centre
    x, cond = rng.normal(size=(20, 3)), rng.normal(size=(20, 6))  # the batch kernel gives the same cheapest phase
    phase, _, acts = label_batch(model.crbm, model.centers, {}, x, cond, model.classifier)
    assert phase.tolist() == np.argmin(step_costs(model.centers, model.classifier, acts)[1], axis=1).tolist()
    with pytest.raises(ValueError, match="labels outside"):
        fit_classifier(h[:10], np.full(10, 3), 3)


def test_an_unset_switch_penalty_is_the_default_for_the_unit_of_the_models_costs():
    """A classifier's nats and a switch gap of distances price a change differently, so each has its default;
    a configured multiplier applies only to the decoding it was configured for."""
    import dataclasses

    from ai4dl.config import DEFAULT_SWITCH_PENALTY, LabelConfig
    from ai4dl.method.classifier import PhaseClassifier
    from ai4dl.method.labelling import resolve_decoding, switch_cost

    distances = make_model().with_info(switch_gap=2.0)
    clf = PhaseClassifier(np.zeros(4), np.ones(4), np.zeros((2, 4)), np.zeros(2), np.zeros((3, 2)), np.zeros(3))
    nats = dataclasses.replace(distances, classifier=clf)
    assert resolve_decoding(nats, "forward", None) == ("forward", DEFAULT_SWITCH_PENALTY["forward"]["nats"])
    assert resolve_decoding(distances, "forward", None) == ("forward", DEFAULT_SWITCH_PENALTY["forward"]["distances"])
    assert switch_cost(distances, "forward") == 2.0 * DEFAULT_SWITCH_PENALTY["forward"]["distances"]
    assert resolve_decoding(nats, "forward", 3) == ("forward", 3.0) and resolve_decoding(nats, "none", 3) == ("none", None)
    pinned = nats.with_info(decoding="viterbi")  # the model's own decoding: the configured forward price is not its
    assert resolve_decoding(pinned, "forward", 3) == ("viterbi", DEFAULT_SWITCH_PENALTY["viterbi"]["nats"])
    assert LabelConfig().penalty is None and LabelConfig(switch_penalty=0.5).penalty == 0.5
    assert LabelConfig(smoothing="none", switch_penalty=0.5).penalty is None


def test_the_classifier_can_be_taught_each_steps_offline_phase_a_few_steps_early():
    from ai4dl.method.training import led

    phases = np.array([0, 0, 0, 1, 1, 2])
    assert led(phases, 2).tolist() == [0, 1, 1, 2, 2, 2]  # every change two steps earlier, the end held
    assert led(phases, 0).tolist() == phases.tolist() and led(phases, 99).tolist() == [2] * 6
    assert led(np.array([], dtype=int), 3).tolist() == []

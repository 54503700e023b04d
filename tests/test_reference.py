"""The imported original AI4DL model labels the DLaaS sample exactly as the original tool did."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ai4dl import stages
from ai4dl.errors import ModelError
from ai4dl.method.labelling import label_arrays
from ai4dl.method.model import load
from ai4dl.method.reference import feature_major_to_time_major, import_reference, original_tool_phases, read_reference


def test_history_layout_permutation():
    nv, nh = 3, 2
    fm = np.array([[f * nh + t for f in range(nv) for t in range(nh)]], dtype=float)  # value = fm index
    tm = feature_major_to_time_major(fm[:, np.argsort(fm[0])], nv, nh)
    # time-major column t*nv + f must hold feature-major index f*nh + t
    assert tm[0].tolist() == [f * nh + t for t in range(nh) for f in range(nv)]


def test_reference_parity_on_dlaas_sample(cfg, dlaas_sample, reference_model, spark, lake):
    ref_path = reference_model
    sample = dlaas_sample
    imported = stages.import_reference_model(cfg, spark, path=str(ref_path))
    model, model_dir = imported.details["model"], imported.details["path"]
    assert load(model_dir).model_id == model.model_id

    stages.ingest(cfg, spark, input=str(sample))
    stages.window(cfg, spark, scaler_from_model=model_dir)
    stages.label(cfg, spark, model=model_dir)
    ours = lake.read("phases").select("pod_id", "step", "phase").toPandas()

    reference = read_reference(ref_path)
    raw = pd.read_csv(sample)
    n_his = reference["n_history"]
    compared = 0
    for pod, trace in raw.groupby("pod.id", sort=False):
        scaled = model.scaler.transform(trace[reference["features"]].to_numpy())
        original = original_tool_phases(scaled, reference)
        mine = ours[ours.pod_id == pod].sort_values("step")
        got = mine["phase"].to_numpy()
        assert mine["phase"].iloc[:n_his].isna().all()  # no history, no phase
        # the original stores step j's phase at row j+1 and never labels the last step
        steps = np.arange(n_his, len(trace) - 1)
        assert got[steps].astype(int).tolist() == original[steps + 1].tolist(), pod
        compared += len(steps)
    assert compared == 204 - 4 * (n_his + 1)


def test_driver_labels_match_original_loop(reference_model):
    ref_path = reference_model
    reference = read_reference(ref_path)
    model = import_reference(ref_path)
    rng = np.random.default_rng(0)
    scaled = rng.normal(size=(40, 8))
    n = reference["n_history"]
    x = scaled[n:]
    cond = np.stack([scaled[j - n : j].ravel() for j in range(n, len(scaled))])  # time-major, oldest first
    phase, _, _ = label_arrays(model, x, cond)
    assert phase[:-1].tolist() == original_tool_phases(scaled, reference)[n + 1 :].tolist()


def test_bad_reference_file(tmp_path):
    bad = tmp_path / "ref.json"
    bad.write_text('{"format": "something-else"}')
    with pytest.raises(ModelError, match="format"):
        import_reference(bad)
    with pytest.raises(ModelError, match="no such"):
        import_reference(tmp_path / "missing.json")

"""The original AI4DL pretrained DLaaS model: import into this project's format, and the original's labelling.

The reference JSON keeps the original tool's history layout: ``B`` and ``A`` columns are feature-major
(``f * n_history + t``), where this project is time-major (``t * n_visible + f``); the import permutes the
columns, nothing else changes. :func:`original_tool_phases` restates the original ``CRBM.predict`` + k-means
``predict`` loop window by window, including its quirk of storing step j's phase at row j+1 and labelling
the first ``n_history + 1`` rows from all-zero activations; it is the oracle the parity test checks against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ai4dl.method.crbm import CRBMWeights
from ai4dl.method.model import ModelError, PhaseModel
from ai4dl.method.scaler import Scaler
from ai4dl.lake.columns import lake_name
from ai4dl.versioned import read_json

REFERENCE_FORMAT = "ai4dl-reference-crbm-kmeans/1"


def read_reference(path: str | Path) -> dict[str, Any]:
    return read_json(Path(path), "no such reference model file", REFERENCE_FORMAT)


def feature_major_to_time_major(m: np.ndarray, n_visible: int, n_history: int) -> np.ndarray:
    """Columns ``f*n_history + t`` -> ``t*n_visible + f``."""
    m = np.asarray(m, dtype=np.float64)
    if m.shape[1] != n_visible * n_history:
        raise ModelError(f"history matrix has {m.shape[1]} columns, expected {n_visible * n_history}")
    return m.reshape(m.shape[0], n_visible, n_history).transpose(0, 2, 1).reshape(m.shape[0], -1)


def import_reference(path: str | Path) -> PhaseModel:
    """This project's model, numerically the original one."""
    d = read_reference(path)
    nv, nh = int(d["n_visible"]), int(d["n_history"])
    features = tuple(lake_name(f) for f in d["features"])
    scaler = Scaler(features, tuple(float(v) for v in d["scaler_mean"]), tuple(float(v) for v in d["scaler_scale"]))
    try:
        weights = CRBMWeights(
            W=np.asarray(d["W"]),
            B=feature_major_to_time_major(np.asarray(d["B"]), nv, nh),
            A=feature_major_to_time_major(np.asarray(d["A"]), nv, nh),
            v_bias=np.asarray(d["v_bias"]).ravel(),
            h_bias=np.asarray(d["h_bias"]).ravel(),
        )
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from None
    return PhaseModel(scaler, weights, np.asarray(d["kmeans_centers"]), info={
        "source": "AI4DL reference model", "imported_from": str(path),
        "decoding": "none",  # the original tool's: each window's nearest centre, whatever label.smoothing says
    })


def original_tool_phases(scaled: np.ndarray, reference: dict[str, Any]) -> np.ndarray:
    """Phase per row of one container's scaled trace, exactly as the original tool produced it (row j+1 holds
    the phase of step j; rows 0..n_history hold the phase of an all-zero activation)."""
    W = np.asarray(reference["W"])
    B = np.asarray(reference["B"])  # feature-major, as the original
    h_bias = np.asarray(reference["h_bias"]).reshape(-1, 1)
    centers = np.asarray(reference["kmeans_centers"])
    n_his = int(reference["n_history"])
    n = len(scaled)
    activations = np.zeros((n, W.shape[0]))
    for k in range(n_his + 1, n):
        window = scaled[k - n_his - 1 : k, :]
        history = window[:-1, :].flatten("F").reshape(-1, 1)
        vis = window[[-1], :].T
        activations[k, :] = (1.0 / (1.0 + np.exp(-(W @ vis + B @ history + h_bias)))).T
    d2 = ((activations[:, None, :] - centers[None, :, :]) ** 2).sum(-1)
    return np.argmin(d2, axis=1)

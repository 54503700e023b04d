"""A phase model as an MLflow pyfunc model: ``predict`` on a pandas frame of raw traces returns their phases.

Logged "from code" (:func:`ai4dl.tracking.log_pyfunc` hands MLflow this file's path, and MLflow runs it when the
model is loaded), so nothing is pickled: the logged model is this file, the model directory (JSON and
safetensors, checked on load like any model directory) and ``serving.json`` (the windowing the model was
trained with). Loading it needs ai4dl installed; ``predict`` is :func:`ai4dl.method.serving.label_traces`.

This module imports without MLflow (ai4dl works without it); only then is there nothing to register.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

try:  # optional: pip install 'ai4dl[mlflow]'
    from mlflow.models import set_model
    from mlflow.pyfunc import PythonModel
except ImportError:  # pragma: no cover - exercised by the no-mlflow test in a subprocess
    set_model = None
    PythonModel = object  # type: ignore[misc,assignment]

MODEL_ARTIFACT = "model"  # the ai4dl model directory
SERVING_ARTIFACT = "serving"  # serving.json: {"max_gap_seconds": ..., "decoding": ..., "switch_penalty": ...}


class PhaseModelPyfunc(PythonModel):  # type: ignore[misc,valid-type]
    """Raw traces (the export's or the lake's columns, several containers) -> ``pod_id, ts, step, phase,
    distance`` per input row, in the input's order; ``phase`` is null for steps without full history."""

    def load_context(self, context: Any) -> None:
        from ai4dl.method.model import load

        self.model = load(context.artifacts[MODEL_ARTIFACT])
        with open(context.artifacts[SERVING_ARTIFACT]) as fh:
            self.serving = json.load(fh)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from ai4dl.method.serving import label_traces

        s = self.serving  # logged before decodings existed: each step's nearest phase, as then
        return label_traces(self.model, pd.DataFrame(model_input), s.get("max_gap_seconds"), s.get("decoding", "none"),
                            s.get("switch_penalty"))


if set_model is not None:  # what MLflow picks up when it runs this file to load the model
    set_model(PhaseModelPyfunc())

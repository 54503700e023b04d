"""A phase model on disk: scaler, CRBM weights, k-means centres and (optionally) the phase classifier the
decoders read (:mod:`ai4dl.method.classifier`), as one directory of JSON and safetensors.

No pickle anywhere: loading a model reads numbers and strings only, so a model directory from elsewhere
cannot run code. ``manifest.json`` lists every file with its SHA-256; a truncated or edited file, a missing
one, or arrays of the wrong shape are refused with a :class:`ModelError` naming the file.

Versions live under ``<models root>/<name>/v0001``, ``v0002``…; a version is written to a temporary directory
and renamed into place, so a crash never leaves half a model that :func:`latest_version` would pick.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ai4dl import __version__, versioned
from ai4dl.errors import ModelError
from ai4dl.method.classifier import ARRAYS as CLASSIFIER_ARRAYS
from ai4dl.method.classifier import PhaseClassifier
from ai4dl.method.crbm import CRBMWeights
from ai4dl.method.scaler import Scaler

FORMAT = "ai4dl-phase-model/1"
MANIFEST = versioned.MANIFEST
SCALER_FILE = "scaler.json"
WEIGHTS_FILE = "weights.safetensors"


@dataclass(frozen=True, eq=False)
class PhaseModel:
    scaler: Scaler
    crbm: CRBMWeights
    centers: np.ndarray  # (k, n_hidden)
    # Phase refinement: parent phase -> (sub-centres (m, n_hidden), the phase id each sub-centre labels).
    refinements: dict[int, tuple[np.ndarray, tuple[int, ...]]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    # What the decoders minimise instead of squared distances (None: the distances, as the original method).
    classifier: PhaseClassifier | None = None

    def __post_init__(self) -> None:
        centers = np.array(self.centers, dtype=np.float64)
        object.__setattr__(self, "centers", centers)
        if tuple(self.scaler.features) and len(self.scaler.features) != self.crbm.n_visible:
            raise ModelError(
                f"scaler has {len(self.scaler.features)} features but the CRBM has {self.crbm.n_visible} visible units"
            )
        if centers.ndim != 2 or centers.shape[1] != self.crbm.n_hidden or centers.shape[0] < 1:
            raise ModelError(f"k-means centres must have shape (k, {self.crbm.n_hidden}), got {centers.shape}")
        for parent, (sub, ids) in self.refinements.items():
            if not 0 <= parent < centers.shape[0]:
                raise ModelError(f"refinement of phase {parent}, but the model has phases 0..{centers.shape[0] - 1}")
            if sub.ndim != 2 or sub.shape[1] != self.crbm.n_hidden or sub.shape[0] != len(ids):
                raise ModelError(f"refinement of phase {parent}: sub-centres {sub.shape} do not fit ids {ids}")
        c = self.classifier
        if c is not None and (c.n_inputs != self.crbm.n_hidden or c.k != centers.shape[0] or self.refinements):
            raise ModelError(f"phase classifier of {c.n_inputs} inputs and {c.k} phases does not fit a model of "
                             f"{self.crbm.n_hidden} hidden units and {centers.shape[0]} phases"
                             + (" (a refined model has none)" if self.refinements else ""))

    @property
    def features(self) -> tuple[str, ...]:
        return self.scaler.features

    @property
    def n_history(self) -> int:
        return self.crbm.n_history

    @property
    def k(self) -> int:
        return self.centers.shape[0]

    @property
    def phase_ids(self) -> list[int]:
        ids = set(range(self.k))
        for _, sub_ids in self.refinements.values():
            ids.update(sub_ids)
        return sorted(ids)

    def arrays(self) -> dict[str, np.ndarray]:
        out = {**self.crbm.as_dict(), "centers": self.centers}
        for parent, (sub, _) in self.refinements.items():
            out[f"refine_{parent}"] = np.asarray(sub, dtype=np.float64)
        if self.classifier is not None:
            out.update(self.classifier.as_dict())
        return out

    @property
    def model_id(self) -> str:
        """Content digest: two models with the same numbers have the same id, whatever their directory."""
        h = hashlib.sha256(self.scaler.to_json().encode())
        for key, arr in sorted(self.arrays().items()):
            h.update(key.encode())
            h.update(np.ascontiguousarray(arr, dtype=np.float64).tobytes())
        h.update(json.dumps({str(p): list(ids) for p, (_, ids) in self.refinements.items()}, sort_keys=True).encode())
        return h.hexdigest()[:16]

    def with_info(self, **info: Any) -> "PhaseModel":
        return replace(self, info={**self.info, **info})


def save(model: PhaseModel, directory: str | Path) -> Path:
    """Write the model to ``directory`` (which must not exist yet), atomically (:func:`ai4dl.versioned.write`)."""
    from safetensors.numpy import save_file

    def write_files(tmp: Path) -> list[str]:
        (tmp / SCALER_FILE).write_text(model.scaler.to_json())
        save_file({k: np.ascontiguousarray(v) for k, v in model.arrays().items()}, str(tmp / WEIGHTS_FILE))
        return [SCALER_FILE, WEIGHTS_FILE]

    return versioned.write(directory, write_files, {
        "format": FORMAT,
        "model_id": model.model_id,
        "features": list(model.features),
        "n_visible": model.crbm.n_visible,
        "n_hidden": model.crbm.n_hidden,
        "n_history": model.n_history,
        "history_layout": "time-major, oldest first: index t*n_visible + f for steps t-n..t-1",
        "k": model.k,
        "refinements": {str(p): list(ids) for p, (_, ids) in model.refinements.items()},
        "classifier": model.classifier is not None,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ai4dl_version": __version__,
        "info": model.info,
    })


def load(directory: str | Path) -> PhaseModel:
    """Read and verify a model directory; every problem is a :class:`ModelError` naming the file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    d = Path(directory)
    manifest_path = d / MANIFEST
    manifest = versioned.read_manifest(d, FORMAT, (SCALER_FILE, WEIGHTS_FILE))
    try:
        scaler = Scaler.from_json((d / SCALER_FILE).read_text())
    except (ValueError, TypeError) as exc:
        raise ModelError(f"{d / SCALER_FILE}: {exc}") from None
    try:
        arrays = load_file(str(d / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise ModelError(f"{d / WEIGHTS_FILE}: unreadable ({exc})") from None
    missing = [k for k in ("W", "B", "A", "v_bias", "h_bias", "centers") if k not in arrays]
    if missing:
        raise ModelError(f"{d / WEIGHTS_FILE}: lacks array(s) {', '.join(missing)}")
    try:
        crbm = CRBMWeights.from_dict({k: arrays[k] for k in ("W", "B", "A", "v_bias", "h_bias")})
    except ValueError as exc:
        raise ModelError(f"{d / WEIGHTS_FILE}: {exc}") from None
    refinements = {}
    for parent, ids in manifest.get("refinements", {}).items():
        key = f"refine_{parent}"
        if key not in arrays:
            raise ModelError(f"{d / WEIGHTS_FILE}: lacks {key} listed in the manifest")
        refinements[int(parent)] = (arrays[key].astype(np.float64), tuple(int(i) for i in ids))
    if tuple(manifest.get("features", [])) != scaler.features:
        raise ModelError(f"{manifest_path}: feature list differs from {SCALER_FILE}")
    if manifest.get("n_history") != crbm.n_history:
        raise ModelError(f"{manifest_path}: n_history {manifest.get('n_history')} but the CRBM weights hold {crbm.n_history}")
    classifier = None
    if manifest.get("classifier"):
        try:
            classifier = PhaseClassifier.from_dict({k: arrays[k] for k in CLASSIFIER_ARRAYS if k in arrays})
        except ModelError as exc:
            raise ModelError(f"{d / WEIGHTS_FILE}: {exc}") from None
    elif any(k in arrays for k in CLASSIFIER_ARRAYS):
        raise ModelError(f"{manifest_path}: the weights hold a phase classifier the manifest does not list")
    model = PhaseModel(scaler, crbm, arrays["centers"], refinements, manifest.get("info", {}), classifier)
    if manifest.get("model_id") and manifest["model_id"] != model.model_id:
        raise ModelError(f"{manifest_path}: model_id does not match the stored numbers")
    return model


def versions(root: str | Path, name: str) -> list[Path]:
    return versioned.versions(root, name)


def info_of(root: str | Path, model_id: str) -> dict | None:
    """The ``info`` of the saved model with ``model_id`` under ``root`` (any name, any version), read from the
    manifests alone; None when no saved model has that id."""
    for manifest in sorted(Path(root).glob("*/v*/manifest.json")):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if m.get("model_id") == model_id:
            return dict(m.get("info") or {})
    return None


def latest_version(root: str | Path, name: str) -> Path:
    return versioned.latest_version(root, name)


def save_version(model: PhaseModel, root: str | Path, name: str) -> Path:
    """Save as the next version ``vNNNN`` of ``name``; an identical model already saved is not duplicated."""
    return versioned.save_version(root, name, model.model_id, lambda d: load(d).model_id, lambda d: save(model, d))

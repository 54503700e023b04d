"""Versioned, checksummed model directories: what the phase model and the policy model are stored as.

A model is a directory of plain files (JSON, safetensors: nothing that runs code when read) and a
``manifest.json`` listing every file with its SHA-256. Versions live under ``<root>/<name>/v0001``,
``v0002``...; a version is written into a temporary directory beside its place and renamed into it, so a crash
never leaves half a model that :func:`latest_version` would pick, and an identical model is never saved twice.
Loading checks the manifest's format and every file's checksum: a truncated or edited file, a missing one, or
a manifest from another kind of model is refused with a :class:`~ai4dl.errors.ModelError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from ai4dl.errors import ModelError

MANIFEST = "manifest.json"
_VERSION = re.compile(r"^v(\d{4,})$")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(target: str | Path, write_files: Callable[[Path], list[str]], manifest: dict[str, Any]) -> Path:
    """Create the model directory ``target`` (which must not exist yet) atomically: ``write_files(tmp)`` writes
    the files into a temporary directory and returns their names; ``manifest`` gets their checksums under
    ``files`` and is written beside them."""
    target = Path(target)
    if target.exists():
        raise ModelError(f"model directory {target} already exists; models are immutable, save a new version")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        names = write_files(tmp)
        body = {**manifest, "files": {name: sha256(tmp / name) for name in names}}
        (tmp / MANIFEST).write_text(json.dumps(body, indent=1, sort_keys=True, default=str))
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read_json(path: Path, missing: str = "missing", fmt: str | tuple[str, ...] | None = None,
              retired: Mapping[str, str] | None = None) -> Any:
    """A model file's JSON (with ``fmt``: a mapping whose ``format`` is ``fmt``, or one of them: the format this
    version writes first, then older ones it still reads); a missing or unreadable file, or another format, is
    one :class:`~ai4dl.errors.ModelError` line naming it (``retired``: formats this version no longer reads, each
    with what to do about it, added to that line)."""
    if not path.is_file():
        raise ModelError(f"{path}: {missing}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})") from None
    formats = (fmt,) if isinstance(fmt, str) else fmt
    if formats is not None and (not isinstance(data, dict) or data.get("format") not in formats):
        found = data.get("format") if isinstance(data, dict) else None
        hint = (retired or {}).get(found) if isinstance(found, str) else None
        expected = " or ".join(repr(f) for f in formats) or "none"
        raise ModelError(f"{path}: format {found!r}, expected {expected}" + (f"; {hint}" if hint else ""))
    return data


def read_manifest(directory: str | Path, fmt: str | tuple[str, ...], required: tuple[str, ...],
                  retired: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The manifest of a model directory of format ``fmt`` (or one of them; ``retired``: as :func:`read_json`),
    after checking that it lists every ``required`` file and that every file it lists is there with its checksum."""
    d = Path(directory)
    if not d.is_dir():
        raise ModelError(f"model directory {d} does not exist")
    path = d / MANIFEST
    manifest = read_json(path, "missing; not a model directory", fmt, retired)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ModelError(f"{path}: lists no files")
    for name, digest in files.items():
        file = d / name
        if not file.is_file():
            raise ModelError(f"{file}: missing")
        if sha256(file) != digest:
            raise ModelError(f"{file}: checksum mismatch (file truncated or edited after the model was saved)")
    for name in required:
        if name not in files:
            raise ModelError(f"{path}: does not list {name}")
    return manifest


def versions(root: str | Path, name: str) -> list[Path]:
    """The version directories of ``name`` under ``root``, oldest first."""
    base = Path(root) / name
    if not base.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in base.iterdir() if (m := _VERSION.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_version(root: str | Path, name: str, what: str = "model", hint: str = "train or import one first") -> Path:
    found = versions(root, name)
    if not found:
        raise ModelError(f"no {what} versions under {Path(root) / name}; {hint}")
    return found[-1]


def save_version(root: str | Path, name: str, model_id: str, id_of: Callable[[Path], str],
                 save: Callable[[Path], Path]) -> Path:
    """Save as the next version ``vNNNN`` of ``name`` (``save(directory)``), unless the latest version already
    holds a model with ``model_id`` (``id_of(directory)``; an unreadable one counts as different)."""
    found = versions(root, name)
    if found:
        try:
            if id_of(found[-1]) == model_id:
                return found[-1]
        except ModelError:
            pass
    number = int(found[-1].name[1:]) + 1 if found else 1
    return save(Path(root) / name / f"v{number:04d}")


__all__ = ["MANIFEST", "latest_version", "read_json", "read_manifest", "save_version", "sha256", "versions", "write"]

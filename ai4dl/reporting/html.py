"""The run report: one self-contained HTML page (``index.html``) with tables and embedded charts.

Images are embedded as base64 ``data:`` URIs, so the single file can be mailed or opened anywhere; the image
files are also kept beside it in ``out_dir`` (copied there when they live elsewhere). Every piece of text
(title, metadata, section headings and paragraphs, table cells, captions) is HTML-escaped.

Usage::

    from ai4dl.reporting.html import Section, write_report
    write_report("data/report", "AI4DL run", {"model_id": "m1", "rows": 1200},
                 [Section("Phases", "k-means on CRBM activations", table=stats_pdf, images=[png])])
"""

from __future__ import annotations

import base64
import html
import math
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #222;
       background: #fafafa; line-height: 1.45; }
main { max-width: 1200px; margin: 0 auto; padding: 1.5rem 2rem 3rem; }
h1 { font-size: 1.6rem; margin: 0 0 .8rem; }
h2 { font-size: 1.2rem; margin: 2rem 0 .6rem; padding-bottom: .25rem; border-bottom: 1px solid #ddd; }
p { margin: .4rem 0 .8rem; max-width: 80ch; }
nav ol { margin: .3rem 0 1rem; padding-left: 1.4rem; font-size: .9rem; }
a { color: #1f5fa8; text-decoration: none; }
table { border-collapse: collapse; font-size: .82rem; margin: .5rem 0 1rem; background: #fff; }
th, td { border: 1px solid #ddd; padding: .25rem .55rem; text-align: right; }
th { background: #f0f0f0; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
table.meta td, table.meta th { text-align: left; }
.table-wrap { overflow-x: auto; }
figure { margin: .8rem 0 1.4rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e3e3; background: #fff; }
figcaption { font-size: .78rem; color: #666; }
.missing { color: #a33; font-style: italic; }
footer { margin-top: 2.5rem; font-size: .75rem; color: #888; }
"""


@dataclass
class Section:
    """One report section: a heading, an optional paragraph (blank lines split paragraphs), an optional table
    (rendered with ``DataFrame.to_html(index=False)``, escaped) and optional images (embedded, in order)."""

    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    images: Sequence[str | Path] = ()


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.6g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _paragraphs(text: str) -> str:
    blocks = [b.strip() for b in str(text).split("\n\n") if b.strip()]
    return "\n".join("<p>" + _esc(b).replace("\n", "<br>") + "</p>" for b in blocks)


def _metadata_table(metadata: Mapping[str, Any]) -> str:
    if not metadata:
        return ""
    rows = "\n".join(f"<tr><th>{_esc(k)}</th><td>{_esc(_fmt(v))}</td></tr>" for k, v in metadata.items())
    return f'<table class="meta">\n{rows}\n</table>'


def _table_html(table: pd.DataFrame, max_rows: int) -> str:
    def _float(v: float) -> str:
        return "-" if math.isnan(v) else f"{v:.4g}"

    body = table.to_html(index=False, escape=True, border=0, na_rep="-", max_rows=max_rows,
                         float_format=_float, classes="data")
    note = f"<p><small>{len(table):,} rows, first {max_rows:,} shown.</small></p>" if len(table) > max_rows else ""
    return f'<div class="table-wrap">{body}</div>{note}'


def _keep_beside(image: Path, out_dir: Path) -> Path:
    """The image's copy in ``out_dir`` (copied there unless it already is there); returns that path."""
    target = out_dir / image.name
    try:
        same = target.exists() and target.resolve() == image.resolve()
    except OSError:
        same = False
    if not same:
        shutil.copyfile(image, target)
    return target


def _image_html(image: str | Path, out_dir: Path) -> str:
    path = Path(image)
    if not path.is_file():
        warnings.warn(f"report image {path} does not exist; left out", stacklevel=3)
        return f'<p class="missing">(image missing: {_esc(path.name)})</p>'
    kept = _keep_beside(path, out_dir)
    mime = _MIME.get(path.suffix.lower(), "application/octet-stream")
    data = base64.b64encode(kept.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:{mime};base64,{data}" alt="{_esc(path.stem)}">'
            f"<figcaption>{_esc(kept.name)}</figcaption></figure>")


def _anchor(i: int) -> str:
    return f"s{i + 1}"


def write_report(
    out_dir: str | Path,
    title: str,
    metadata: Mapping[str, Any] | None = None,
    sections: Sequence[Section] = (),
    *,
    max_table_rows: int = 500,
) -> Path:
    """Write ``out_dir/index.html`` and return its path.

    The page has ``title``, the run ``metadata`` (``{name: value}``, e.g. model id, rows, timings; rendered as a
    two-column table with a ``generated_at`` UTC time appended unless given), a table of contents when there is
    more than one section, then every :class:`Section`. Section images are embedded as base64 data URIs and
    copied beside ``index.html`` (a missing image is reported in the page, with a warning, not an error: a
    report should not fail a finished run). Tables longer than ``max_table_rows`` are cut, with a note. The file
    is written to a temporary name and renamed, so a reader never sees half a report.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(metadata or {})
    meta.setdefault("generated_at", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))

    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body><main>",
        f"<header><h1>{_esc(title)}</h1>{_metadata_table(meta)}</header>",
    ]
    if len(sections) > 1:
        items = "".join(f'<li><a href="#{_anchor(i)}">{_esc(s.title)}</a></li>' for i, s in enumerate(sections))
        parts.append(f"<nav><ol>{items}</ol></nav>")
    for i, section in enumerate(sections):
        parts.append(f'<section id="{_anchor(i)}">')
        parts.append(f"<h2>{_esc(section.title)}</h2>")
        if section.text:
            parts.append(_paragraphs(section.text))
        if section.table is not None:
            parts.append(_table_html(section.table, max_table_rows))
        for image in section.images or ():
            parts.append(_image_html(image, out))
        parts.append("</section>")
    parts.append("<footer>ai4dl run report</footer>")
    parts.append("</main></body></html>")

    index = out / "index.html"
    tmp = out / f".index.html.{os.getpid()}.tmp"
    tmp.write_text("\n".join(parts) + "\n", encoding="utf-8")
    os.replace(tmp, index)
    return index

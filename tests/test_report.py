"""Report charts and the HTML run report (pandas only, no Spark)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ai4dl.reporting import plots
from ai4dl.config import POLICIES, PoliciesConfig
from ai4dl.policies.calibration import ServiceLevel
from ai4dl.policies.model import PolicyModel
from ai4dl.reporting.html import Section, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GIB = 2**30


def _container(pod: str, service: str, n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    step = np.arange(n)
    # three phases in blocks: warm-up (no history -> null), loading (0), training (1), checkpointing (2)
    phase = np.where(step < 8, -1, np.where(step < 40, 0, np.where((step // 15) % 4 == 3, 2, 1)))
    cpu_level = np.choose(phase + 1, [0.3, 1.0, 3.2, 1.8])
    mem_level = np.choose(phase + 1, [1.0, 2.5, 5.0, 6.0])
    df = pd.DataFrame(
        {
            "pod_id": pod,
            "service": service,
            "ts": pd.Timestamp("2024-03-01 10:00:00") + pd.to_timedelta(step * 15, unit="s"),
            "step": step.astype("int32"),
            "phase": pd.array([None if p < 0 else int(p) for p in phase], dtype="Int32"),
            "cpu_usage_cores": np.clip(cpu_level + rng.normal(0, 0.15, n), 0, None),
            "cpu_num_cores": 4.0,
            "mem_current": np.clip(mem_level + rng.normal(0, 0.1, n), 0, None) * GIB,
            "mem_limit": 8.0 * GIB,
            "behaviour": "train",
        }
    )
    df.loc[17, "cpu_usage_cores"] = np.nan  # an unknown sample
    return df


@pytest.fixture(scope="module")
def phases_pdf() -> pd.DataFrame:
    return pd.concat([_container("pod-a", "svc-1", 160, 1), _container("pod-b", "svc-2", 120, 2)], ignore_index=True)


@pytest.fixture(scope="module")
def summary_pdf() -> pd.DataFrame:
    rows = []
    for res in ("cpu", "mem"):
        for i, p in enumerate(POLICIES):
            rows.append({"policy": p, "resource": res, "containers": 2, "savings_vs_static": 0.0 if p == "static"
                         else 0.1 * i + (0.05 if res == "mem" else 0.0),
                         "fulfilment": 1.0 if p == "static" else 0.99 - 0.03 * i})
    df = pd.DataFrame(rows)
    df.loc[len(df) - 1, "fulfilment"] = np.nan  # a null ratio is skipped, not fatal
    return df


def _assert_png(path, min_bytes: int = 2048) -> None:
    assert path.exists(), path
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes, (path, len(data))


def test_phase_colours_stable():
    assert plots.PHASE_COLOURS[0] == plots.phase_colour(0)
    assert plots.phase_colour(None) == plots.phase_colour(np.nan) == plots.PHASE_COLOURS[None]
    assert plots.phase_colour(pd.NA) == plots.NULL_PHASE_COLOUR
    assert plots.NULL_PHASE_COLOUR not in [plots.phase_colour(i) for i in range(40)]
    assert len({plots.phase_colour(i) for i in range(18)}) == 18
    assert plots.phase_colour(18) == plots.phase_colour(0)


def test_trace_phases(tmp_path, phases_pdf):
    one = phases_pdf[phases_pdf["pod_id"] == "pod-a"].sample(frac=1.0, random_state=0)  # unsorted input
    _assert_png(plots.plot_trace_phases(one, tmp_path / "sub" / "trace.png"))
    _assert_png(plots.plot_trace_phases(one.drop(columns=["ts"]), tmp_path / "trace_steps.png", title="by step"))
    _assert_png(plots.plot_trace_phases(one.iloc[:0], tmp_path / "trace_empty.png"), min_bytes=500)


def test_phase_boxplots(tmp_path, phases_pdf):
    _assert_png(plots.plot_phase_boxplots(phases_pdf, tmp_path / "boxes.png"))
    no_nulls = phases_pdf[phases_pdf["phase"].notna()]
    _assert_png(plots.plot_phase_boxplots(no_nulls, tmp_path / "boxes2.png"))


def test_policy_curves(tmp_path, phases_pdf):
    one = phases_pdf[phases_pdf["pod_id"] == "pod-b"]
    one = one[one["step"] != 50]  # a missing step is replayed as unknown usage
    stats = {0: {"cpu": 1.2, "mem": 2.8 * GIB}, 1: {"cpu": 3.5, "mem": 5.3 * GIB}, 2: {"cpu": 2.1, "mem": float("nan")}}
    model = PolicyModel(PoliciesConfig(interval_steps=10), ServiceLevel(0.95, oom_kills_per_100h=10.0), stats, {},
                        {"vpa": {"cpu": 0.8, "mem": 0.95}}, (), {}, None)
    _assert_png(plots.plot_policy_curves(one, tmp_path / "policies.png", model))
    _assert_png(plots.plot_policy_curves(one, tmp_path / "policies_cpu.png", model, policies=["static", "vpa"],
                                         resource="cpu"))
    _assert_png(plots.plot_policy_curves(one, tmp_path / "policies_default.png"))  # no model: the configured knobs
    with pytest.raises(ValueError):
        plots.plot_policy_curves(one, tmp_path / "x.png", model, resource="disk")
    with pytest.raises(ValueError):
        plots.plot_policy_curves(one, tmp_path / "x.png", model, policies=["nope"])


def test_savings(tmp_path, summary_pdf):
    _assert_png(plots.plot_savings(summary_pdf, tmp_path / "savings.png"))
    _assert_png(plots.plot_savings(summary_pdf.iloc[:0], tmp_path / "savings_empty.png"), min_bytes=500)


def test_write_report(tmp_path, phases_pdf, summary_pdf):
    img_dir = tmp_path / "elsewhere"
    trace = plots.plot_trace_phases(phases_pdf[phases_pdf["pod_id"] == "pod-a"], img_dir / "trace.png")
    savings = plots.plot_savings(summary_pdf, img_dir / "savings.png")
    out = tmp_path / "report"
    table = pd.DataFrame({"policy": ["vpa", "phase.rule"], "savings": [0.4213, 0.3777], "note": ["a<b", None]})
    index = write_report(
        out,
        "AI4DL run & report",
        {"model_id": "crbm-42", "rows": 12345, "timings": {"fit_s": 1.5}},
        [
            Section("Policy summary", "Savings <script>alert(1)</script> vs static.\n\nSecond paragraph.",
                    table=table),
            Section("Charts", "", images=[trace, savings]),
        ],
    )
    assert index == out / "index.html"
    page = index.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "AI4DL run &amp; report" in page
    assert "Policy summary" in page and "Charts" in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "crbm-42" in page and "12345" in page and "fit_s=1.5" in page
    assert re.search(r"<td>vpa</td>", page) and "<td>phase.rule</td>" in page
    assert "0.4213" in page and "a&lt;b" in page
    assert page.count('src="data:image/png;base64,') == 2
    # the PNGs are kept beside the page too
    assert (out / "trace.png").read_bytes() == trace.read_bytes()
    assert (out / "savings.png").exists()


def test_write_report_missing_image(tmp_path):
    with pytest.warns(UserWarning):
        index = write_report(tmp_path, "r", None, [Section("only", images=[tmp_path / "gone.png"])])
    assert "image missing" in index.read_text()


# --- the report in a real browser ---------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
# Injected into a copy of the page: records every failed load and console error, then every image's decoded
# size, into a <pre> that --dump-dom prints once the page has loaded.
PROBE = """<script>(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(String(e.message || (e.target && (e.target.src || e.target.href)) || "error").slice(0, 200));
  }, true);
  ["error", "warn"].forEach(function (level) {
    var original = console[level];
    console[level] = function () { errors.push(level + ": " + Array.prototype.join.call(arguments, " ")); original.apply(console, arguments); };
  });
  window.addEventListener("load", function () {
    var images = Array.prototype.map.call(document.images, function (i) {
      return {src: i.src.slice(0, 40), complete: i.complete, width: i.naturalWidth, height: i.naturalHeight};
    });
    var pre = document.createElement("pre");
    pre.id = "ai4dl-probe";
    pre.textContent = JSON.stringify({images: images, errors: errors});
    document.body.appendChild(pre);
  });
})();</script>"""


def open_in_chromium(page, workdir):
    """Load ``page`` in headless Chromium: (what the probe saw, the browser's console lines)."""
    import html
    import json
    import subprocess

    probed = workdir / "probed.html"
    text = page.read_text(encoding="utf-8")
    assert "<head>" in text
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           f"--user-data-dir={workdir / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="ai4dl-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the page never finished loading: {done.stderr[-2000:]}"
    console = [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
    return json.loads(html.unescape(found.group(1))), console


@pytest.mark.browser
def test_report_in_a_real_browser(tmp_path, phases_pdf, summary_pdf):
    """The page a user opens: every image decodes in Chromium, nothing is logged to the console, and the page
    alone (moved away from its PNGs) still shows everything."""
    import shutil

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (make system-deps, or apt-get install chromium)")
    pngs = tmp_path / "pngs"
    one = phases_pdf[phases_pdf["pod_id"] == "pod-a"]
    images = [
        plots.plot_trace_phases(one, pngs / "trace_phases.png"),
        plots.plot_phase_boxplots(phases_pdf, pngs / "phase_boxplots.png"),
        plots.plot_policy_curves(one, pngs / "policy_curves.png"),
        plots.plot_savings(summary_pdf, pngs / "savings.png"),
    ]
    index = write_report(tmp_path / "report", "ai4dl run report", {"lake": "data/lake", "labelled steps": 280},
                         [Section("A container's life by phase", "CPU and memory.", images=images[:2]),
                          Section("Policies", "Allocated vs used.", table=summary_pdf.round(4), images=images[2:])])
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(index, alone / "index.html")  # one self-contained file: nothing beside it is needed
    page = (alone / "index.html").read_text(encoding="utf-8")
    assert not re.findall(r'\bsrc="(?!data:)', page) and not re.findall(r'\bhref="(?!#)', page)
    assert "<link" not in page and "url(" not in page

    seen, console = open_in_chromium(alone / "index.html", tmp_path)
    assert len(seen["images"]) == len(images)
    for img in seen["images"]:
        assert img["complete"] and img["width"] > 100 and img["height"] > 100, img
    assert seen["errors"] == [] and console == [], (seen["errors"], console)

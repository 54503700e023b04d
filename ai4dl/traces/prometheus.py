"""Prometheus as a trace source: the cAdvisor series a Kubernetes cluster already scrapes, as DLaaS export rows.

Fleets that run today keep their container metrics in Prometheus, not in CSV exports. This module reads them
through Prometheus's HTTP API (``/api/v1/query_range``) and produces the export's own (dotted) columns as
strings, so the rows go through exactly the validation and quarantine of a CSV (:func:`ingest_prometheus`
hands them to :func:`ai4dl.traces.ingest.ingest_source`): a step whose memory limit is unknown is quarantined
as ``missing_value:mem_limit`` like a blank CSV field, never silently dropped or guessed.

Mapping (one row per container and query step where the container reports its memory usage; ``pod_id`` is
``<pod>/<container>``, ``service`` the ``prometheus.service_label`` label, by default the namespace):

- ``cpu.usage.cores``: ``irate(container_cpu_usage_seconds_total[rate_range])``, the rate between the last
  two scrapes: a per-sample usage like the export's (``rate`` would smooth a phase change over the range);
- ``cpu.usage``: the same in nanocores (CPU-nanoseconds per second, the unit of the Kubernetes metrics API);
- ``cpu.num.cores``: ``container_spec_cpu_quota / container_spec_cpu_period`` (the CFS limit), else
  kube-state-metrics' ``kube_pod_container_resource_limits{resource="cpu"}``;
- ``cpu.usage.pct``: 100 x usage / limit; ``cpu.usage.pct.container.requested``: 100 x usage / the CPU
  request (kube-state-metrics), else / the limit (Kubernetes sets the request to the limit when only the
  limit is given);
- ``mem.current``: ``container_memory_usage_bytes``; ``mem.working.set``: ``container_memory_working_set_bytes``;
- ``mem.limit``: ``container_spec_memory_limit_bytes`` when > 0 (cAdvisor reports 0 for "no limit"), else
  kube-state-metrics' memory limit; ``mem.usage.pct``: 100 x working set / limit (what the DLaaS export holds,
  and what the kubelet compares with the limit).

Series are aggregated ``by (namespace, pod, container)`` (``sum`` for CPU, which older cAdvisors split per
core, ``max`` for the rest) so the extra labels of a cAdvisor series (``id``, ``name``, ``image``) do not
split a container. The label selector ``prometheus.selector`` (default: real containers, not the pod-level
cgroup or the pause container) applies to the cAdvisor series.

Queries are split in time so that no range query exceeds ``prometheus.max_points`` steps per series
(Prometheus refuses more than 11,000); a 5xx answer or a connection error is retried with exponential
backoff; a 4xx answer (a bad selector, a bad time) or a server still unreachable after the retries is an
:class:`~ai4dl.errors.InputError` of one line. Only the standard library talks HTTP.
"""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ai4dl.durations import parse_duration, parse_time
from ai4dl.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from ai4dl.config import IngestConfig, PrometheusConfig
    from ai4dl.lake.tables import Lake
    from ai4dl.traces.ingest import IngestResult

MAX_POINTS = 11_000  # Prometheus's own limit of points per series in one range query
KEYS = ("namespace", "pod", "container")
# The export's columns, in its order (the rows are handed to the CSV validation under these names).
COLUMNS = (
    "timestamp", "service", "pod.id", "cpu.num.cores", "cpu.usage", "cpu.usage.cores", "cpu.usage.pct",
    "cpu.usage.pct.container.requested", "mem.current", "mem.limit", "mem.usage.pct", "mem.working.set",
)
DEFAULT_SELECTOR = 'container!="",container!="POD",image!=""'

def promql_duration(seconds: float) -> str:
    """A duration as PromQL writes it in a range selector (whole milliseconds).

    >>> promql_duration(300.0), promql_duration(0.5)
    ('300000ms', '500ms')
    """
    return f"{int(round(seconds * 1000))}ms"


def chunks(start: float, end: float, step: float, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """``[start, end]`` cut into ranges of at most ``max_points`` evaluation steps each, on the same step grid.

    >>> chunks(0, 95, 10, max_points=4)
    [(0, 30), (40, 70), (80, 90)]
    """
    if end < start:
        raise InputError(f"the end of the range ({end}) is before its start ({start})")
    if max_points < 1:
        raise InputError(f"max_points must be at least 1, got {max_points}")
    n = int(math.floor((end - start) / step + 1e-9)) + 1  # evaluation steps start, start+step, ... <= end
    out = []
    for first in range(0, n, max_points):
        last = min(first + max_points, n) - 1
        out.append((start + first * step, start + last * step))
    return out


@dataclass
class PrometheusClient:
    """``/api/v1/query_range`` of one server, retried on 5xx and connection errors with exponential backoff."""

    url: str
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 1.0
    sleep: Callable[[float], Any] = time.sleep

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise InputError(f"{self.url!r} is not a Prometheus URL (e.g. http://prometheus:9090)")
        self.url = self.url.rstrip("/")

    def query_range(self, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The ``result`` of one range query (a list of ``{"metric": labels, "values": [[t, "v"], ...]}``)."""
        params = urllib.parse.urlencode({"query": query, "start": repr(start), "end": repr(end), "step": repr(step)})
        request = urllib.request.Request(
            f"{self.url}/api/v1/query_range", data=params.encode(), method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        attempt = 0
        while True:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = json.loads(response.read().decode("utf-8"))
                break
            except urllib.error.HTTPError as exc:
                if exc.code < 500:  # the query or the range is wrong: retrying cannot help
                    raise InputError(f"Prometheus at {self.url} refused the query {query!r}: HTTP {exc.code} {_error_text(exc)}") from None
                reason = f"HTTP {exc.code} {_error_text(exc)}"
            except (urllib.error.URLError, socket.timeout, ConnectionError, json.JSONDecodeError) as exc:
                reason = str(getattr(exc, "reason", exc))
            if attempt >= self.retries:
                raise InputError(f"Prometheus at {self.url} is unreachable after {attempt + 1} attempt(s): {reason}") from None
            self.sleep(self.backoff * (2 ** attempt))
            attempt += 1
        if body.get("status") != "success":
            raise InputError(f"Prometheus at {self.url} failed the query {query!r}: {body.get('error', body)}")
        data = body.get("data", {})
        if data.get("resultType") != "matrix":
            raise InputError(f"Prometheus at {self.url} answered {data.get('resultType')!r}, not a matrix, to {query!r}")
        return data.get("result", [])

    def query_chunked(self, query: str, start: float, end: float, step: float, max_points: int = MAX_POINTS) -> list[dict[str, Any]]:
        """One range query over a long range: its chunks' series concatenated per label set."""
        series: dict[tuple, dict[str, Any]] = {}
        for lo, hi in chunks(start, end, step, max_points):
            for s in self.query_range(query, lo, hi, step):
                key = tuple(sorted(s.get("metric", {}).items()))
                series.setdefault(key, {"metric": s.get("metric", {}), "values": []})["values"].extend(s.get("values", []))
        return list(series.values())


def _error_text(exc: urllib.error.HTTPError) -> str:
    """Prometheus's own error message of a failed request (its JSON ``error``), on one line."""
    try:
        text = exc.read().decode("utf-8", "replace")
        text = json.loads(text).get("error", text)
    except Exception:  # noqa: BLE001 - the status code alone still says enough
        text = exc.reason
    return " ".join(str(text).split())[:300]


def queries(selector: str = DEFAULT_SELECTOR, rate_range: str = "5m") -> dict[str, str]:
    """The PromQL of every series read, by role."""
    by = "by (" + ", ".join(KEYS) + ")"
    sel = "{" + selector + "}"
    window = promql_duration(parse_duration(rate_range, positive=True))
    return {
        "cpu_cores": f"sum {by} (irate(container_cpu_usage_seconds_total{sel}[{window}]))",
        "cpu_limit": f"max {by} ((container_spec_cpu_quota{sel} > 0) / container_spec_cpu_period{sel})",
        "cpu_limit_ksm": f'max {by} (kube_pod_container_resource_limits{{resource="cpu"}})',
        "cpu_request_ksm": f'max {by} (kube_pod_container_resource_requests{{resource="cpu"}})',
        "mem_current": f"max {by} (container_memory_usage_bytes{sel})",
        "mem_working_set": f"max {by} (container_memory_working_set_bytes{sel})",
        "mem_limit": f"max {by} (container_spec_memory_limit_bytes{sel} > 0)",
        "mem_limit_ksm": f'max {by} (kube_pod_container_resource_limits{{resource="memory"}})',
    }


Sample = dict[tuple[str, str, str, float], str]


def _index(series: Iterable[dict[str, Any]]) -> Sample:
    """``(namespace, pod, container, t) -> value string`` of query results."""
    out: Sample = {}
    for s in series:
        labels = s.get("metric", {})
        key = tuple(labels.get(k, "") for k in KEYS)
        for t, v in s.get("values", []):
            out[(*key, float(t))] = v
    return out


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _fmt(value: float | None) -> str:
    """A derived number as the export would write it; unknown is blank (``missing_value`` in validation)."""
    if value is None:
        return ""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _timestamp(t: float) -> str:
    return str(int(t)) if float(t).is_integer() else repr(float(t))


def to_rows(results: dict[str, list[dict[str, Any]]], service_label: str = "namespace") -> list[dict[str, str]]:
    """Export rows (``COLUMNS``, all strings) from the results of :func:`queries`.

    One row per container and step where ``mem_current`` has a value: cAdvisor reports a container's memory
    as long as it exists, while an ``irate`` keeps a value between samples; a blank field is a metric the
    cluster did not report, left for validation to quarantine.

    >>> series = lambda v: [{"metric": {"namespace": "ns", "pod": "p", "container": "c"}, "values": [[100, v]]}]
    >>> r = to_rows({"cpu_cores": series("0.5"), "cpu_limit": series("2"), "mem_current": series("100"),
    ...              "mem_working_set": series("50"), "mem_limit": series("200")})
    >>> [(k, r[0][k]) for k in ("timestamp", "pod.id", "cpu.usage.pct", "mem.usage.pct", "cpu.usage")]
    [('timestamp', '100'), ('pod.id', 'p/c'), ('cpu.usage.pct', '25'), ('mem.usage.pct', '25'), ('cpu.usage', '500000000')]
    """
    idx = {name: _index(series) for name, series in results.items()}
    service_of: dict[tuple[str, str, str], str] = {}
    if service_label not in KEYS:  # another label: looked up on the memory series, which carry it unaggregated
        for s in results.get("mem_current_labels", []):
            labels = s.get("metric", {})
            service_of[tuple(labels.get(k, "") for k in KEYS)] = labels.get(service_label, "")

    def get(name: str, key: tuple) -> str | None:
        return idx.get(name, {}).get(key)

    rows = []
    for key in sorted(idx.get("mem_current", {})):
        ns, pod, container, t = key
        cores = get("cpu_cores", key)
        limit = get("cpu_limit", key) or get("cpu_limit_ksm", key)
        request = get("cpu_request_ksm", key) or limit
        mem_limit = get("mem_limit", key) or get("mem_limit_ksm", key)
        working_set = get("mem_working_set", key)
        c, lim, req = _number(cores), _number(limit), _number(request)
        ws, mlim = _number(working_set), _number(mem_limit)
        service = ns if service_label == "namespace" else service_of.get((ns, pod, container), "")
        rows.append({
            "timestamp": _timestamp(t),
            "service": service,
            "pod.id": f"{pod}/{container}",
            "cpu.num.cores": limit or "",
            "cpu.usage": _fmt(c * 1e9 if c is not None else None),
            "cpu.usage.cores": cores or "",
            "cpu.usage.pct": _fmt(100.0 * c / lim if c is not None and lim else None),
            "cpu.usage.pct.container.requested": _fmt(100.0 * c / req if c is not None and req else None),
            "mem.current": idx["mem_current"][key],
            "mem.limit": mem_limit or "",
            "mem.usage.pct": _fmt(100.0 * ws / mlim if ws is not None and mlim else None),
            "mem.working.set": working_set or "",
        })
    return rows


def fetch_rows(client: PrometheusClient, settings: PrometheusConfig, start: float, end: float) -> list[dict[str, str]]:
    """Every cAdvisor series of the range, as export rows (see :func:`to_rows`)."""
    step = parse_duration(settings.step, positive=True)
    qs = queries(settings.selector, settings.rate_range)
    if settings.service_label not in KEYS:
        qs["mem_current_labels"] = f"container_memory_usage_bytes{{{settings.selector}}}"
    results = {name: client.query_chunked(q, start, end, step, settings.max_points) for name, q in qs.items()}
    return to_rows(results, settings.service_label)


def ingest_prometheus(lake: Lake, ingest_settings: IngestConfig, settings: PrometheusConfig, url: str | None = None) -> IngestResult:
    """Range ``[prometheus.start, prometheus.end]`` of a Prometheus server -> bronze and quarantine, validated
    exactly like an export (a rerun over the same range inserts nothing)."""
    from pyspark.sql import types as T

    from ai4dl.lake.tables import local_frame
    from ai4dl.traces.ingest import ingest_source

    url = url or settings.url
    if not url:
        raise InputError("no Prometheus URL: pass one (ai4dl ingest --from prometheus URL) or set prometheus.url")
    if not settings.start:
        raise InputError("no start of the range: pass --start (e.g. now-6h or 2024-05-01T00:00:00Z) or set prometheus.start")
    start, end = parse_time(settings.start), parse_time(settings.end)
    client = PrometheusClient(url, settings.timeout_seconds, settings.retries, settings.backoff_seconds)
    rows = fetch_rows(client, settings, start, end)
    where = f"{client.url} [{_timestamp(start)}, {_timestamp(end)}] step {settings.step}"
    schema = T.StructType([T.StructField(c, T.StringType(), True) for c in (*COLUMNS, "source_file")])
    spark = lake.spark
    df = local_frame(spark, [(*(r[c] for c in COLUMNS), where) for r in rows], schema)
    return ingest_source(lake, ingest_settings, df, where)


__all__ = [
    "COLUMNS", "DEFAULT_SELECTOR", "MAX_POINTS", "PrometheusClient", "chunks", "fetch_rows", "ingest_prometheus",
    "queries", "to_rows",
]

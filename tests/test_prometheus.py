"""Prometheus ingest against a real Prometheus server on loopback, filled with the DLaaS sample as cAdvisor series.

The series are written as OpenMetrics, backfilled with ``promtool tsdb create-blocks-from openmetrics`` and
served by ``prometheus`` (Debian package; ``make test`` installs it). What lands in bronze must equal the
same sample ingested from its CSV. The HTTP client's retries and errors are tested against a tiny stdlib
server that answers what each test needs.
"""

from __future__ import annotations

import csv
import http.server
import json
import math
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ai4dl.errors import ConfigError, InputError
from ai4dl.durations import parse_time
from ai4dl.traces.prometheus import PrometheusClient, chunks

pytestmark = pytest.mark.prometheus

NAMESPACE_OF = "service"  # the CSV's service becomes the namespace label
CONTAINER = "main"
CPU_PERIOD = 100_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _series(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def write_openmetrics(sample: Path, out: Path, shift: int) -> None:
    """The DLaaS sample as the cAdvisor series of one container per ``pod.id``, timestamps shifted by ``shift``.

    The CPU counter integrates ``cpu.usage.cores`` over each interval, so ``irate`` at a sample gives the
    sample's usage back; it starts 10 s before the first sample (the container started then), so the first
    sample has a rate too. A pause container and a pod-level cgroup (which the default selector excludes)
    report memory as well.
    """
    rows = list(csv.DictReader(sample.open()))
    by_pod: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_pod.setdefault(r["pod.id"], []).append(r)
    metrics: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], t: int, value: float) -> None:
        metrics.setdefault(name, []).append(f"{name}{_series(labels)} {value!r} {t}")

    for pod, trace in by_pod.items():
        trace.sort(key=lambda r: int(r["timestamp"]))
        labels = {"namespace": trace[0][NAMESPACE_OF], "pod": pod, "container": CONTAINER, "image": "dlaas", "id": f"/kubepods/{pod}"}
        counter, prev = 0.0, int(trace[0]["timestamp"]) - 10
        add("container_cpu_usage_seconds_total", labels, prev + shift, counter)
        for r in trace:
            t = int(r["timestamp"])
            counter += float(r["cpu.usage.cores"]) * (t - prev)
            prev = t
            add("container_cpu_usage_seconds_total", labels, t + shift, counter)
            add("container_spec_cpu_quota", labels, t + shift, float(r["cpu.num.cores"]) * CPU_PERIOD)
            add("container_spec_cpu_period", labels, t + shift, float(CPU_PERIOD))
            add("container_memory_usage_bytes", labels, t + shift, float(r["mem.current"]))
            add("container_memory_working_set_bytes", labels, t + shift, float(r["mem.working.set"]))
            add("container_spec_memory_limit_bytes", labels, t + shift, float(r["mem.limit"]))
            for other in ({"container": "POD", "image": "pause"}, {"container": "", "image": ""}):
                add("container_memory_usage_bytes", {**labels, **other}, t + shift, 1.0)
    # A container in another namespace without a memory limit: 5 samples, CPU limited.
    t0 = min(int(r["timestamp"]) for r in rows)
    labels = {"namespace": "other", "pod": "unlimited", "container": CONTAINER, "image": "x"}
    for i in range(6):
        t = t0 + shift + 10 * i
        add("container_cpu_usage_seconds_total", labels, t, 2.0 * i)
        add("container_spec_cpu_quota", labels, t, 2.0 * CPU_PERIOD)
        add("container_spec_cpu_period", labels, t, float(CPU_PERIOD))
        if i:
            add("container_memory_usage_bytes", labels, t, 1e6)
            add("container_memory_working_set_bytes", labels, t, 1e6)
    with out.open("w") as fh:
        for name, lines in metrics.items():
            fh.write(f"# TYPE {name} gauge\n")
            # OpenMetrics wants each series' samples together and in time order.
            for line in sorted(lines, key=lambda s: (s.rsplit(" ", 2)[0], int(s.rsplit(" ", 1)[1]))):
                fh.write(line + "\n")
        fh.write("# EOF\n")


@pytest.fixture(scope="module")
def prometheus_server(tmp_path_factory, dlaas_sample):
    """A real Prometheus on loopback serving the shifted DLaaS sample: (url, shift, first ts, last ts)."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("prometheus/promtool not installed (Debian package 'prometheus'; `make system-deps` installs it)")
    root = tmp_path_factory.mktemp("prometheus")
    stamps = [int(r["timestamp"]) for r in csv.DictReader(dlaas_sample.open())]
    # Backfilled blocks must fall inside the retention and behind the head: end the data 3 hours ago, on the
    # 10 s grid the sample (and the query step) is on.
    shift = (int(time.time()) - 3 * 3600 - max(stamps)) // 10 * 10
    om = root / "series.om"
    write_openmetrics(dlaas_sample, om, shift)
    tsdb = root / "tsdb"
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                   check=True, capture_output=True, timeout=120)
    conf = root / "prometheus.yml"
    conf.write_text("global:\n  scrape_interval: 10s\nscrape_configs: []\n")
    port = _free_port()
    log = (root / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={tsdb}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=3650d",
         # A live cluster ends a vanished container's series with staleness markers; backfilled blocks have
         # none, so a short lookback stops a series at its last sample instead of repeating it for 5 minutes.
         "--query.lookback-delta=5s"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"prometheus did not start: {(root / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, shift, min(stamps) + shift, max(stamps) + shift
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _bronze(lake, shift: int = 0):
    from pyspark.sql import functions as F

    cols = ["pod_id", "service", "cpu_num_cores", "cpu_usage_cores", "cpu_usage_pct", "cpu_usage_pct_container_requested",
            "mem_current", "mem_limit", "mem_usage_pct", "mem_working_set", "cpu_usage"]
    df = lake.read("bronze").select(*cols, (F.col("ts").cast("long") - F.lit(shift)).alias("epoch"))
    return df.toPandas().set_index(["pod_id", "epoch"]).sort_index()


def test_prometheus_range_lands_in_bronze_as_the_csv_does(cfg, spark, lake, dlaas_sample, prometheus_server):
    from ai4dl import stages
    from ai4dl.lake.tables import Lake

    url, shift, first, last = prometheus_server
    # max_points 100: the 8.5-hour range is read in chunks of 100 steps (Prometheus's limit is 11,000).
    prom_cfg = cfg.replace(prometheus={"start": str(first - 60), "end": str(last + 60), "step": "10s", "max_points": 100,
                                       "selector": 'namespace="service1",container!="",container!="POD",image!=""'})
    t0 = time.time()
    result = stages.ingest(prom_cfg, spark, input=url, fmt="prometheus").details["result"]
    seconds = time.time() - t0
    assert (result.read, result.valid, result.quarantined) == (204, 204, 0), result.summary()
    print(f"prometheus ingest: {result.summary()} in {seconds:.1f}s")

    csv_cfg = cfg.replace(lake={"root": cfg.lake.root + "_csv", "models": cfg.lake.models + "_csv"})
    csv_lake = Lake.for_config(spark, csv_cfg)
    stages.ingest(csv_cfg, spark, input=str(dlaas_sample))

    got = _bronze(lake, shift)
    want = _bronze(csv_lake)
    got.index = got.index.set_levels(got.index.levels[0].str.removesuffix(f"/{CONTAINER}"), level=0)
    assert list(got.index) == list(want.index)  # same containers, same timestamps, nothing more
    assert (got["service"] == want["service"]).all()
    # Measured series come back as they went in (the CPU rate through irate, to float rounding).
    for c in ("cpu_num_cores", "cpu_usage_cores", "mem_current", "mem_limit", "mem_working_set"):
        diff = (got[c] - want[c]).abs() / want[c].abs().clip(lower=1e-12)
        assert diff.max() < 1e-9, c
    # Percentages are derived from them; the export rounds its own to 2 decimals.
    for c in ("cpu_usage_pct", "mem_usage_pct"):
        assert (got[c] - want[c]).abs().max() <= 0.005 + 1e-9, c
    # Without a kube-state-metrics request the request is the limit; cpu_usage is in nanocores.
    assert (got["cpu_usage_pct_container_requested"] - got["cpu_usage_pct"]).abs().max() < 1e-9
    assert ((got["cpu_usage"] - got["cpu_usage_cores"] * 1e9).abs() < 1e-3).all()

    again = stages.ingest(prom_cfg, spark, input=url, fmt="prometheus").details["result"]
    assert again.inserted == 0 and again.valid == 204  # a rerun over the same range inserts nothing


def test_prometheus_missing_limit_is_quarantined(cfg, spark, lake, prometheus_server):
    """A container without a memory limit is not guessed at: its rows are quarantined with the reason, as a
    blank CSV field would be; the pause container and the pod-level cgroup are never read."""
    from ai4dl.traces.prometheus import ingest_prometheus

    url, _, first, _ = prometheus_server
    settings = cfg.replace(prometheus={"start": str(first - 60), "end": str(first + 120),
                                       "selector": 'namespace="other",container!="",container!="POD",image!=""'}).prometheus
    result = ingest_prometheus(lake, cfg.ingest, settings, url)
    assert (result.read, result.valid, result.quarantined) == (5, 0, 5)
    reasons = {r["reason"] for r in lake.read("quarantine").collect()}
    assert reasons == {"missing_value:mem_limit;missing_value:mem_usage_pct"}
    raw = json.loads(lake.read("quarantine").first()["raw"])
    assert raw["pod.id"] == "unlimited/main" and raw["cpu.num.cores"] == "2"
    none = cfg.replace(prometheus={"start": str(first - 60), "end": str(first), "selector": 'pod="nobody"'}).prometheus
    empty = ingest_prometheus(lake, cfg.ingest, none, url)
    assert (empty.read, empty.inserted) == (0, 0)


def test_cli_shortcuts_become_prometheus_settings():
    from ai4dl.cli import _overrides, _parser
    from ai4dl.config import load_config

    args = _parser().parse_args(["ingest", "--from", "prometheus", "http://prom:9090", "--start", "2024-05-01T00:00:00Z",
                                 "--end", "now-1h", "--step", "15s"])
    assert (args.format, args.input) == ("prometheus", "http://prom:9090")
    cfg = load_config(None, _overrides(args))
    assert (cfg.prometheus.start, cfg.prometheus.end, cfg.prometheus.step) == ("2024-05-01T00:00:00Z", "now-1h", "15s")
    assert parse_time(cfg.prometheus.start) == 1714521600.0
    with pytest.raises(ConfigError, match="prometheus.step"):
        load_config(None, ["prometheus.step=soon"])
    with pytest.raises(ConfigError, match="prometheus.max_points"):
        load_config(None, ["prometheus.max_points=20000"])


def test_chunks_never_exceed_the_point_limit():
    parts = chunks(0, 200_000, 10, 11_000)
    assert all(round((hi - lo) / 10) + 1 <= 11_000 for lo, hi in parts)
    steps = [lo + i * 10 for lo, hi in parts for i in range(round((hi - lo) / 10) + 1)]
    assert steps == list(range(0, 200_001, 10))  # every step once, in order
    with pytest.raises(InputError, match="before its start"):
        chunks(10, 0, 1)


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers the scripted (status, body) pairs in turn, then repeats the last one."""

    script: list[tuple[int, dict]] = []
    calls = 0

    def do_POST(self):  # noqa: N802 - http.server's naming
        cls = type(self)
        status, body = cls.script[min(cls.calls, len(cls.script) - 1)]
        cls.calls += 1
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def scripted_server():
    handler = type("Handler", (_Scripted,), {"script": [], "calls": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


OK = {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"pod": "p"}, "values": [[1, "2"]]}]}}


def test_5xx_is_retried_with_backoff(scripted_server):
    url, handler = scripted_server
    handler.script = [(503, {"status": "error", "error": "overloaded"}), (502, {}), (200, OK)]
    waits: list[float] = []
    client = PrometheusClient(url, retries=3, backoff=0.5, sleep=waits.append)
    assert client.query_range("up", 0, 10, 10) == OK["data"]["result"]
    assert (handler.calls, waits) == (3, [0.5, 1.0])


def test_4xx_is_one_line_without_retry(scripted_server):
    url, handler = scripted_server
    handler.script = [(400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 3:\nunexpected"})]
    client = PrometheusClient(url, retries=3, sleep=lambda s: None)
    with pytest.raises(InputError) as err:
        client.query_range("up{", 0, 10, 10)
    assert handler.calls == 1
    assert "\n" not in str(err.value) and "HTTP 400" in str(err.value) and "parse error at char 3" in str(err.value)


def test_unreachable_server_is_one_line():
    port = _free_port()  # nothing listens there
    waits: list[float] = []
    client = PrometheusClient(f"http://127.0.0.1:{port}", retries=2, backoff=0.1, sleep=waits.append)
    with pytest.raises(InputError, match=f"127.0.0.1:{port} is unreachable after 3 attempt") as err:
        client.query_range("up", 0, 10, 10)
    assert "\n" not in str(err.value) and waits == [0.1, 0.2]
    with pytest.raises(InputError, match="not a Prometheus URL"):
        PrometheusClient("prom:9090")
    assert not math.isnan(parse_time("now"))

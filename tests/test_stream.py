"""The live stream (``ai4dl stream``): same answers as batch, exactly once, late samples, model changes, and
the Kubernetes export of its recommendations.

The batch lake (module fixture) runs import-reference-model, ingest, window, label and policies on the DLaaS
sample; every stream test streams the same samples into its own lake and deploys the batch's policy model (its
calibrated knobs, statistics and transitions), as the replay scored it.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ai4dl import stages
from ai4dl.lake.tables import Lake
from ai4dl.method.labelling import label_windows
from ai4dl.method.model import load
from ai4dl.policies.live import Deployment
from ai4dl.policies.model import load as load_policies
from ai4dl.policies.replay import INPUT_COLUMNS, Trace, allocations
from ai4dl.stream.online import Live, advance
from tests.configs import config_under

ROOT = Path(__file__).resolve().parents[1]
KEY = ["pod_id", "ts"]


def _phases(lake) -> pd.DataFrame:
    cols = ["pod_id", "ts", "step", "phase", "distance", "model_id"]
    return lake.read("phases").select(*cols).toPandas().sort_values(KEY).reset_index(drop=True)


def _chunks(sample: Path, out: Path, parts: int) -> list[str]:
    """The sample cut in time into ``parts`` CSV files (each container's samples in order across them)."""
    rows = list(csv.reader(sample.open()))
    header, body = rows[0], sorted(rows[1:], key=lambda r: int(r[0]))
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(body)), parts)):
        p = out / f"part{i}.csv"
        with p.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(body[j] for j in part)
        paths.append(str(p))
    return paths


@pytest.fixture(scope="module")
def batch(spark, tmp_path_factory, test_config, dlaas_sample, reference_model):
    """The batch answers: the DLaaS sample labelled through the stages by the reference model's numbers decoded
    with the default, causal decoder (the imported original keeps its own per-step labels: this copy carries a
    switch gap measured on the sample and no pinned decoding, so the stream has decoder state to carry)."""
    from dataclasses import replace

    from ai4dl.method.labelling import switch_gap
    from ai4dl.method.model import save_version

    base = tmp_path_factory.mktemp("batch")
    cfg = config_under(test_config, base)
    reference_dir = stages.import_reference_model(cfg, spark, path=str(reference_model)).details["path"]
    stages.ingest(cfg, spark, input=str(dlaas_sample))
    stages.window(cfg, spark, scaler_from_model=reference_dir)
    reference = load(reference_dir)
    lake = Lake.for_config(spark, cfg)
    acts = np.stack(label_windows(lake.read("silver"), reference).where("activations IS NOT NULL").toPandas()["activations"])
    info = {k: v for k, v in reference.info.items() if k != "decoding"}
    decodable = replace(reference, info={**info, "switch_gap": switch_gap(reference.centers, acts)})
    model_dir = str(save_version(decodable, cfg.lake.models, "reference-forward"))
    assert cfg.label.smoothing == "forward"
    stages.label(cfg, spark, model=model_dir)
    nearest = label_windows(lake.read("silver"), reference).toPandas().sort_values(KEY)["phase"].astype("Int64").fillna(-1)
    decoded = _phases(lake)["phase"].astype("Int64").fillna(-1)
    assert (decoded.to_numpy() != nearest.to_numpy()).sum() >= 3  # the decoder changes phases: its state matters
    policies = stages.policies(cfg, spark).details["path"]
    return {"cfg": cfg, "lake": lake, "model_dir": model_dir, "phases": _phases(lake), "policies": policies,
            "full": lake.read("phases").select(*INPUT_COLUMNS).toPandas()}


def _stream_cfg(batch, tmp_path, **stream):
    return batch["cfg"].replace(
        lake={"root": str(tmp_path / "lake"), "models": batch["cfg"].lake.models},
        report={"dir": str(tmp_path / "report")},
        label={"model": batch["model_dir"]},
        policies={"model": batch["policies"]},
        stream=stream,
    )


def _expected_allocation(cfg, batch, pod: str, step: int) -> dict[str, float]:
    """The batch replay's allocation at ``step`` of container ``pod`` (its whole labelled trace known), under
    the policy model's deployed policies at their calibrated knobs."""
    model = load_policies(batch["policies"])
    deployed = model.deployment(cfg.stream.policy)
    trace = Trace.of(batch["full"][batch["full"]["pod_id"] == pod], model.params)
    return {r: float(allocations(p, trace, r, model.params_for(p, r), model.phase_stats, model.transitions)[0][step])
            for r, p in deployed.items()}


@pytest.mark.parametrize("policy", ["best", pytest.param("vpa", marks=pytest.mark.slow)])
def test_streamed_phases_and_recommendations_equal_batch(spark, batch, dlaas_sample, tmp_path, policy):
    """Two availableNow runs over a bronze that grows in between: the phases equal ``ai4dl label``'s, and each
    recommendation equals what the batch replay (knowing the whole trace) allocates at that step."""
    cfg = _stream_cfg(batch, tmp_path, policy=policy)
    first, second = _chunks(dlaas_sample, tmp_path, 2)
    stages.ingest(cfg, spark, input=first)
    lake = Lake.for_config(spark, cfg)
    r1 = stages.stream(cfg, spark)
    recs1 = lake.read("recommendations").toPandas()
    stages.ingest(cfg, spark, input=second)
    r2 = stages.stream(cfg, spark)
    assert r1.written["phases"] + r2.written["phases"] == 204 and r2.written["quarantine"] == 0

    got, want = _phases(lake), batch["phases"]
    pd.testing.assert_frame_equal(got.drop(columns="distance"), want.drop(columns="distance"))
    np.testing.assert_allclose(got["distance"].astype(float), want["distance"].astype(float), rtol=1e-9, equal_nan=True)

    recs2 = lake.read("recommendations").toPandas()
    assert 1 <= len(recs1) <= 4 and len(recs2) == 4  # the first half of the sample spans fewer containers
    checked = 0
    for recs in (recs1, recs2):
        for rec in recs.itertuples():
            assert rec.for_step == rec.step + 1 and rec.interval == rec.for_step // cfg.policies.interval_steps
            n = int((batch["full"]["pod_id"] == rec.pod_id).sum())
            # the replay holds one allocation per interval: compare at for_step, or (past the trace's end) at its
            # last step when that is still the same interval
            at = rec.for_step if rec.for_step < n else rec.step
            if at // cfg.policies.interval_steps != rec.interval:
                continue
            want_alloc = _expected_allocation(cfg, batch, rec.pod_id, at)
            assert math.isclose(rec.cpu_cores, want_alloc["cpu"], rel_tol=1e-12), (rec.pod_id, rec.step)
            assert math.isclose(rec.mem_bytes, want_alloc["mem"], rel_tol=1e-12), (rec.pod_id, rec.step)
            checked += 1
    assert checked >= 5
    last = recs2.set_index("pod_id")
    phases = batch["phases"]
    policy_model = load_policies(batch["policies"])  # the next phase told: its service's table, else the fleet's
    for pod, rec in last.iterrows():
        mine = phases[phases["pod_id"] == pod].dropna(subset=["phase"])
        assert rec["step"] == int(phases[phases["pod_id"] == pod]["step"].max())
        assert rec["phase"] == int(mine["phase"].iloc[-1]) and rec["phase_name"] == f"phase {rec['phase']}"
        run = (mine["phase"] != mine["phase"].shift()).cumsum()
        assert rec["phase_since_step"] == int(mine[run == run.iloc[-1]]["step"].iloc[0])
        deployed = policy_model.deployment(policy)
        told = policy_model.service_next_phase.get(rec["service"], policy_model.next_phase).get(int(rec["phase"]))
        if told is None:
            assert pd.isna(rec["next_phase"]) and pd.isna(rec["next_phase_probability"])
        else:
            assert (rec["next_phase"], rec["next_phase_probability"]) == pytest.approx(told)
        assert rec["model_id"] == load(batch["model_dir"]).model_id
        assert (rec["cpu_policy"], rec["mem_policy"]) == (deployed["cpu"], deployed["mem"])
        assert rec["policy_model_id"] == policy_model.model_id


@pytest.mark.slow
def test_a_replayed_batch_changes_nothing(spark, batch, dlaas_sample, tmp_path):
    """Rerunning with a fresh checkpoint replays every batch: the MERGEs keep phases and recommendations."""
    cfg = _stream_cfg(batch, tmp_path)
    stages.ingest(cfg, spark, input=str(dlaas_sample))
    lake = Lake.for_config(spark, cfg)
    stages.stream(cfg, spark)
    before = (_phases(lake), lake.read("recommendations").toPandas().sort_values("pod_id").reset_index(drop=True))
    versions = (lake.version("phases"), lake.version("recommendations"))
    again = cfg.replace(stream={"checkpoint": str(tmp_path / "other-checkpoint")})
    stages.stream(again, spark)
    after = (_phases(lake), lake.read("recommendations").toPandas().sort_values("pod_id").reset_index(drop=True))
    pd.testing.assert_frame_equal(before[0], after[0])
    pd.testing.assert_frame_equal(before[1], after[1])
    from delta.tables import DeltaTable

    merges = DeltaTable.forPath(spark, lake.path("recommendations")).history().where("version > %d" % versions[1])
    for m in merges.select("operationMetrics").collect():  # Delta may commit the MERGE, but it changes no row
        assert m[0].get("numTargetRowsInserted", "0") == "0" and m[0].get("numTargetRowsUpdated", "0") == "0"


def test_late_samples_are_quarantined_and_counted(batch, dlaas_sample):
    """The rule, on the pure step: a sample not after the container's last labelled step is a late row with
    its reason and counted in the state; samples out of order inside one batch are sorted, not late."""
    model = load(batch["model_dir"])
    live = Live(model=model, model_id=model.model_id, n_history=3, deployment=Deployment.of(load_policies(batch["policies"])))
    pod = _exec1_rows(dlaas_sample)
    first, rest = pod.iloc[:20], pod.iloc[20:]
    out1, st = advance("exec1", first.sample(frac=1.0, random_state=1), None, live)  # shuffled: still in order
    assert (out1["kind"] == "phase").sum() == 20 and st["late_samples"] == 0
    assert out1[out1["kind"] == "phase"]["step"].tolist() == list(range(20))
    replayed = pd.concat([first.iloc[[5, 19]], rest])  # one old, one equal to the last labelled ts
    out2, st2 = advance("exec1", replayed, st, live)
    late = out2[out2["kind"] == "late"]
    assert len(late) == 2 and set(late["reason"]) == {"late_sample"} and st2["late_samples"] == 2
    assert (out2["kind"] == "phase").sum() == len(rest)
    rec = out2[out2["kind"] == "rec"].iloc[0]
    assert rec["late_samples"] == 2 and rec["step"] == len(pod) - 1


def _exec1_rows(dlaas_sample) -> pd.DataFrame:
    """The DLaaS sample's container exec1 as bronze rows reach the stream's step."""
    sample = pd.read_csv(dlaas_sample)
    pod = sample[sample["pod.id"] == "exec1"].rename(columns=lambda c: c.replace(".", "_")).rename(columns={"timestamp": "ts"})
    pod["ts"] = pd.to_datetime(pod["ts"], unit="s")
    pod["behaviour"], pod["source_file"], pod["ingested_at"] = None, "f", pod["ts"]
    return pod


def test_the_next_phase_told_is_the_containers_services(batch, dlaas_sample, tmp_path):
    """A container of a service seen in training is told its service's next phase; any other, the fleet's. The
    stream's inputs carry the policy model's per-service tables."""
    import dataclasses

    model = load(batch["model_dir"])
    policy_model = load_policies(batch["policies"])
    served = stages.live_inputs(_stream_cfg(batch, tmp_path), model, model.model_id, policy_model, batch["policies"])
    assert served.service_next_phase == policy_model.service_next_phase and served.service_next_phase
    assert served.next_phase == policy_model.next_phase
    pod = _exec1_rows(dlaas_sample)
    phases = range(len(model.centers))
    fleet = Live(model=model, model_id=model.model_id, n_history=3, deployment=Deployment.of(policy_model),
                 next_phase={p: (70, 0.5) for p in phases})
    own = dataclasses.replace(fleet, service_next_phase={str(pod["service"].iloc[0]): {p: (80, 0.9) for p in phases}})
    other = dataclasses.replace(fleet, service_next_phase={"another service": {p: (90, 0.9) for p in phases}})
    for live, told in ((fleet, (70, 0.5)), (own, (80, 0.9)), (other, (70, 0.5))):
        out, _ = advance("exec1", pod, None, live)
        rec = out[out["kind"] == "rec"].iloc[0]
        assert (rec["next_phase"], rec["next_phase_probability"]) == told


@pytest.mark.slow
def test_a_new_model_is_picked_up_at_a_batch_boundary_and_logged(spark, batch, dlaas_sample, tmp_path):
    import shutil

    from ai4dl.method.model import save

    import dataclasses

    from ai4dl.errors import ModelError
    from ai4dl.policies.model import save_version

    cfg = _stream_cfg(batch, tmp_path)
    models = tmp_path / "models"
    shutil.copytree(batch["model_dir"], models / "ai4dl" / "v0001")
    shutil.copytree(batch["policies"], models / "policies" / "v0001")
    cfg = cfg.replace(lake={"models": str(models)}, label={"model": None}, policies={"model": None})
    first, second = _chunks(dlaas_sample, tmp_path, 2)
    lake = Lake.for_config(spark, cfg)
    stages.ingest(cfg, spark, input=first)
    stages.stream(cfg, spark)
    old = load(models / "ai4dl" / "v0001")
    moved = old.__class__(old.scaler, old.crbm, old.centers[::-1].copy(), info=old.info)  # same maths, phases renamed
    save(moved, models / "ai4dl" / "v0002")
    stages.ingest(cfg, spark, input=second)
    # a phase model without a policy model fitted on its phases is refused, naming both
    with pytest.raises(ModelError, match=f"phase model {old.model_id}, but phases here come from phase model {moved.model_id}"):
        stages.stream(cfg, spark)
    policies = load_policies(models / "policies" / "v0001")
    save_version(dataclasses.replace(policies, phase_model_id=moved.model_id), models, "policies")
    # the query starts with v0002 and its policy model (the current ones when it starts) ...
    stages.stream(cfg, spark)
    phases = lake.read("phases").toPandas()
    assert set(phases["model_id"]) == {old.model_id, moved.model_id}
    log = lake.read("run_log").where("job = 'stream' AND status = 'model'").toPandas()
    assert log["message"].str.contains(moved.model_id).any() and log["message"].str.contains(old.model_id).any()


def test_a_model_change_between_batches_restarts_the_query_with_it(spark, batch, lake, cfg):
    """The check inside a micro-batch: a writer whose model is no longer current refuses the batch before it
    writes anything and names the model to restart with."""
    from ai4dl.stream.query import BatchWriter, ModelChanged, StreamReport

    writer = BatchWriter(lake, "m1", lambda: "m2", StreamReport())
    with pytest.raises(ModelChanged):
        writer(spark.createDataFrame([], "kind string"), 7)
    assert writer.pending == "m2" and not lake.exists("phases")


@pytest.mark.slow
def test_files_landing_in_a_folder_are_validated_ingested_and_labelled(spark, batch, dlaas_sample, tmp_path):
    """``stream.input``: each run ingests the folder's new files with ``ingest``'s rules (a bad row quarantined
    with its reason, a file without the required columns quarantined whole, the rest ingested) and labels
    them: the phases equal ``ai4dl label``'s; a file seen once is never ingested again."""
    import shutil

    folder = tmp_path / "incoming"
    folder.mkdir()
    first, second = _chunks(dlaas_sample, tmp_path, 2)
    rows = list(csv.reader(open(first)))
    bad = list(rows[-1])
    bad[0], bad[rows[0].index("mem.current")] = str(int(bad[0]) + 1), "lots"  # one row that cannot be a sample
    with open(folder / "a.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([*rows, bad])
    (folder / "other.csv").write_text("foo,bar\n1,2\n")  # not a trace export
    cfg = _stream_cfg(batch, tmp_path, input=str(folder))
    lake = Lake.for_config(spark, cfg)

    r1 = stages.stream(cfg, spark).details["report"]
    assert (r1.files, r1.quarantined) == (2, 2) and r1.ingested == r1.phases == len(rows) - 1
    quarantine = lake.read("quarantine").toPandas()
    refused = quarantine[quarantine["reason"] == "file_refused"]
    assert len(refused) == 1 and refused["source_file"].iloc[0].endswith("other.csv")
    assert "mem.current" in refused["raw"].iloc[0]  # the refusal says what is missing
    assert len(quarantine) == 2 and "lots" in quarantine[quarantine["reason"] != "file_refused"]["raw"].iloc[0]

    shutil.copy(second, folder / "b.csv")
    r2 = stages.stream(cfg, spark).details["report"]
    assert r2.files == 1 and r2.quarantined == 0
    got, want = _phases(lake), batch["phases"]
    pd.testing.assert_frame_equal(got.drop(columns="distance"), want.drop(columns="distance"))
    r3 = stages.stream(cfg, spark).details["report"]
    assert (r3.files, r3.phases) == (0, 0) and lake.count("quarantine") == 2 and lake.count("bronze") == 204


@pytest.mark.slow
def test_a_finished_containers_state_expires_and_a_new_trace_starts(spark, batch, dlaas_sample, tmp_path):
    """``stream.state_ttl_hours``: past it, a container's state is gone; samples it sends later start a new
    trace (steps from 0, no history: the first n_history steps unlabelled) and replace its recommendation."""
    cfg = _stream_cfg(batch, tmp_path, state_ttl_hours=1e-6)  # 3.6 ms: expired by the next run
    first, second = _chunks(dlaas_sample, tmp_path, 2)
    lake = Lake.for_config(spark, cfg)
    stages.ingest(cfg, spark, input=first)
    stages.stream(cfg, spark)
    before = lake.read("recommendations").toPandas().set_index("pod_id")
    stages.ingest(cfg, spark, input=second)
    stages.stream(cfg, spark)
    phases = lake.read("phases").toPandas()
    second_ts = pd.to_datetime(pd.read_csv(second)["timestamp"], unit="s")
    both = [p for p in before.index if (phases[(phases["pod_id"] == p)]["ts"].isin(second_ts)).any()]
    assert both, "a container spans both halves of the sample"
    for pod in both:
        again = phases[(phases["pod_id"] == pod) & phases["ts"].isin(second_ts)].sort_values("ts")
        assert again["step"].tolist() == list(range(len(again)))
        assert again["phase"].iloc[:3].isna().all()
        rec = lake.read("recommendations").where(f"pod_id = '{pod}'").toPandas().iloc[0]
        assert rec["ts"] > before.loc[pod, "ts"] and rec["step"] == len(again) - 1


def test_the_phases_merge_prunes_by_an_exact_instant_in_any_session_time_zone(spark):
    """The MERGE's ``t.ts >= <batch's first ts>`` must hold the stored rows of that very instant: the literal is
    exact to the microsecond and carries its zone."""
    from ai4dl.stream.query import _ts_literal

    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        for tz in ("UTC", "America/New_York", "Asia/Kolkata"):
            spark.conf.set("spark.sql.session.timeZone", tz)
            for micros in (1565962220000000, 1565962220123457, -1):
                assert spark.sql(f"SELECT {_ts_literal(micros)} = timestamp_micros({micros})").first()[0], (tz, micros)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


# --- SIGKILL mid-stream, restart ----------------------------------------------------------------------------


def _batches(checkpoint: Path, kind: str) -> int:
    folder = checkpoint / kind
    return len([p for p in folder.iterdir() if p.name.isdigit()]) if folder.is_dir() else 0


def _wait_for(condition, proc, log: Path, timeout: float = 400.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"stream exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"stream made no progress; log tail:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_stream_restarts_without_loss_or_duplicates(spark, batch, dlaas_sample, tmp_path):
    """``ai4dl stream --trigger continuous`` in its own driver while the sample lands chunk by chunk; SIGKILL
    while a micro-batch is in flight (offsets logged, commit not), land the rest, restart: phases equal batch,
    one recommendation per container at its last step, nothing twice."""
    from ai4dl.cli import main

    cfg = _stream_cfg(batch, tmp_path)
    chunks = _chunks(dlaas_sample, tmp_path, 5)
    stages.ingest(cfg, spark, input=chunks[0])
    checkpoint = tmp_path / "lake" / "_checkpoints" / "stream"
    sets = [
        "--set", f"lake.root={cfg.lake.root}", "--set", f"lake.models={cfg.lake.models}",
        "--set", f"label.model={batch['model_dir']}", "--set", f"policies.model={batch['policies']}",
        "--set", f"report.dir={tmp_path / 'report'}", "--set", f"spark.ivy_cache={ROOT / '.cache' / 'ivy'}",
        "--set", "spark.shuffle_partitions=2",
    ]
    log = tmp_path / "stream.log"
    cmd = [sys.executable, "-m", "ai4dl.cli", "stream", "--trigger", "continuous", "--interval", "1",
           "--master", "local[1]", "--set", "spark.driver_memory=768m", *sets]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_for(lambda: _batches(checkpoint, "commits") >= 1, proc, log)
        stages.ingest(cfg, spark, input=chunks[1])
        _wait_for(lambda: _batches(checkpoint, "commits") >= 2, proc, log)
        stages.ingest(cfg, spark, input=chunks[2])
        _wait_for(lambda: _batches(checkpoint, "offsets") > _batches(checkpoint, "commits"), proc, log)
        in_flight = (_batches(checkpoint, "offsets"), _batches(checkpoint, "commits"))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert in_flight[0] > in_flight[1] >= 2  # killed with a micro-batch started and not committed
    for chunk in chunks[3:]:
        stages.ingest(cfg, spark, input=chunk)
    assert main(["stream", "--trigger", "availableNow", *sets]) == 0

    lake = Lake.for_config(spark, cfg)
    got = _phases(lake)
    assert len(got) == 204 and not got.duplicated(KEY).any()
    pd.testing.assert_frame_equal(got.drop(columns="distance"), batch["phases"].drop(columns="distance"))
    recs = lake.read("recommendations").toPandas().set_index("pod_id").sort_index()
    last = batch["phases"].groupby("pod_id")["step"].max().sort_index()
    assert recs["step"].tolist() == last.tolist()
    runs = lake.read("run_log").where("job = 'stream'").toPandas()
    killed = set(runs["run_id"]) - set(runs[runs["status"] == "finished"]["run_id"])
    assert len(killed) == 1  # the killed run left its "started" (and "model") rows only

    # ... and the recommendations leave as Kubernetes objects (tests/test_k8s.py decodes them into the API types)
    import yaml

    out = tmp_path / "vpa.yaml"
    assert main(["recommendations", "--format", "vpa", "--update-mode", "InPlaceOrRecreate", "--out", str(out), *sets]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["metadata"]["name"] for d in docs] == sorted(recs.index)
    for doc in docs:
        rec = recs.loc[doc["metadata"]["name"]]
        uncapped = doc["status"]["recommendation"]["containerRecommendations"][0]["uncappedTarget"]
        assert doc["kind"] == "VerticalPodAutoscaler" and doc["spec"]["updatePolicy"]["updateMode"] == "InPlaceOrRecreate"
        assert uncapped["cpu"] == f"{math.ceil(round(rec['cpu_cores'] * 1000, 6))}m"
        assert int(uncapped["memory"]) == math.ceil(rec["mem_bytes"])
    assert main(["recommendations", "--format", "resize", "--out", str(tmp_path / "resize.yaml"), *sets]) == 0
    bodies = list(yaml.safe_load_all((tmp_path / "resize.yaml").read_text()))
    assert len(bodies) == 4 and all(b["spec"]["containers"][0]["resources"]["requests"] for b in bodies)
    assert main(["recommendations", "--format", "patch", "--out", str(tmp_path / "patch.yaml"), *sets]) == 2  # a Job's template

"""The policy model: ``ai4dl policies`` fits it on training containers, saves it versioned and checksummed,
scores it on held-out ones and writes the gold tables from it; bad models and unreachable service levels are
one-line errors that write nothing."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from ai4dl import stages
from ai4dl.config import LIVE_POLICIES, POLICIES
from ai4dl.errors import ModelError
from ai4dl.lake.tables import Lake
from ai4dl.policies import model as M
from ai4dl.policies.rules import KNOBS
from tests.configs import config_under

PHASE_MODEL = "phase-model-1"


def _phases(spark, containers: int = 14, steps: int = 150, seed: int = 0):
    """A fleet of labelled traces: phases in runs, each with its CPU and memory level (memory that ramps in
    phase 1), limits of several sizes."""
    from ai4dl.lake.schema import PHASES

    rng = np.random.default_rng(seed)
    rows = []
    t0 = datetime(2024, 1, 1)
    for c in range(containers):
        cores, mem_limit = float(rng.choice([2, 4, 8])), float(rng.choice([8e9, 16e9]))
        phase = np.repeat(rng.integers(0, 3, steps // 12 + 1), 12)[:steps]
        level = {0: 0.2, 1: 0.5, 2: 0.8}
        mem = mem_limit * 0.3
        for i in range(steps):
            p = int(phase[i])
            mem = min(mem_limit, max(0.05 * mem_limit, mem + (0.01 if p == 1 else -0.004) * mem_limit
                                     + rng.normal(0, 0.01) * mem_limit))
            cpu = min(cores, cores * level[p] * (1 + rng.normal(0, 0.25)))
            rows.append((f"pod-{c}", f"svc{c % 3}", t0 + timedelta(seconds=30 * i), i, None if i < 3 else p, None, None,
                         max(cpu, 0.0), cores, mem, mem_limit, None, PHASE_MODEL))
    return spark.createDataFrame(rows, PHASES)


@pytest.fixture(scope="module")
def fitted(spark, test_config, tmp_path_factory):
    base = tmp_path_factory.mktemp("policy-model")
    cfg = config_under(test_config, base, policies={"interval_steps": 5})
    lake = Lake.for_config(spark, cfg)
    lake.overwrite("phases", _phases(spark), properties={"ai4dl.model_id": PHASE_MODEL})
    result = stages.policies(cfg, spark)
    return {"cfg": cfg, "lake": lake, "result": result, "model": result.details["model"], "path": result.details["path"]}


def test_the_model_holds_everything_a_decision_needs(fitted):
    model, cfg, lake = fitted["model"], fitted["cfg"], fitted["lake"]
    assert model.phase_model_id == PHASE_MODEL and model.params == cfg.policies
    assert model.data_version["version"] == lake.version("phases") and model.data_version["phases"] == lake.path("phases")
    assert set(model.phase_stats) == {0, 1, 2}
    for entry in model.phase_stats.values():  # phase.rule's shares of the limit, phase.headroom's tables
        assert {"cpu_fraction", "mem_fraction", "cpu_headroom", "mem_headroom"} <= set(entry)
    assert model.transitions and all(abs(sum(d.values()) - 1.0) < 1e-9 for d in model.transitions.values())
    assert model.next_phase and all(nxt[0] != src for src, nxt in model.next_phase.items())
    # each service's own transition counts, read beside the fleet's by its containers' next-phase table; the
    # fleet's probabilities (taken from their sums) are the behaviour stage's transitions (transition_counts) of the
    # same runs
    from ai4dl.behaviour.sequences import run_lengths, transition_counts
    from ai4dl.method.split import ContainerSplit
    from ai4dl.policies.nextphase import normalise_transitions

    assert set(model.service_transitions) == {"svc0", "svc1", "svc2"}
    runs = run_lengths(ContainerSplit.of(cfg.window).training(lake.read("phases")), cfg.behaviour.min_run_steps)
    gold = normalise_transitions(transition_counts(runs).toPandas())
    assert set(gold) == set(model.transitions)
    for src, dsts in gold.items():
        assert model.transitions[src] == pytest.approx(dsts)
    per_service = runs.groupBy("service").count().toPandas().set_index("service")["count"]
    for svc, per in model.service_transitions.items():  # each container's runs but its last are counted once
        containers = runs.where(f"service = '{svc}'").select("pod_id").distinct().count()
        assert sum(n for d in per.values() for n in d.values()) == per_service[svc] - containers
    for policy in POLICIES:  # every family's knob, per resource (None: a policy without one)
        for resource in ("cpu", "mem"):
            value = model.knobs[policy][resource]
            assert (value is None) == (policy not in KNOBS), (policy, resource)
            if value is not None:
                assert value in KNOBS[policy][1]
                assert getattr(model.params_for(policy, resource), KNOBS[policy][0]) == value
    assert set(model.best) == {"cpu", "mem"} and set(model.best.values()) <= set(LIVE_POLICIES)
    assert model.level.cpu_fulfilment == 0.95 and model.level.oom_kills_per_100h == cfg.policies.oom_budget_per_100h
    assert model.bounds["cpu"]["min"] == 0.025 and model.bounds["mem"]["min"] == 250 * 1024 * 1024


def test_saved_versioned_checksummed_and_pickle_free(fitted, tmp_path):
    path, model = fitted["path"], fitted["model"]
    assert path.endswith("/policies/v0001")
    loaded = M.load(path)
    assert loaded.model_id == model.model_id and loaded.as_dict() == model.as_dict()
    import pathlib

    assert loaded.service_transitions == model.service_transitions
    # a format-2 model (saved before them) is still read, with its id: the key is only stored when there are some
    bare = dataclasses.replace(model, service_transitions={})
    assert set(bare.as_dict()) == {"params", "service_level", "phase_stats", "transitions", "knobs", "training", "best",
                                   "phase_model_id", "data_version", "forecasters"}  # format 2's layout
    old = M.save(bare, tmp_path / "format2")
    manifest = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "format": "ai4dl-policy-model/2"}))
    read = M.load(old)
    assert read.model_id == bare.model_id != model.model_id and read.service_next_phase == {}
    names = sorted(p.name for p in pathlib.Path(path).iterdir())
    assert names == ["manifest.json", "policy.json"]  # JSON only: nothing a load could run
    # the same model again is the same version; another one is the next
    root = tmp_path / "models"
    assert M.save_version(model, root, "policies") == M.save_version(model, root, "policies") == root / "policies" / "v0001"
    other = dataclasses.replace(model, best={"cpu": "vpa", "mem": "vpa"})
    assert M.save_version(other, root, "policies") == root / "policies" / "v0002"
    assert M.latest_version(root, "policies") == root / "policies" / "v0002"


def test_a_tampered_or_foreign_model_is_refused_naming_the_file(fitted, tmp_path, test_config):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(fitted["path"], d)
    policy = d / "policy.json"
    data = json.loads(policy.read_text())
    data["knobs"]["vpa"]["mem"] = 0.5
    policy.write_text(json.dumps(data))
    with pytest.raises(ModelError, match=r"policy.json: checksum mismatch"):
        M.load(d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["format"] = "ai4dl-phase-model/1"
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="manifest.json: format 'ai4dl-phase-model/1'"):
        M.load(d)
    manifest["format"] = "ai4dl-policy-model/1"  # a model an earlier ai4dl saved: refitted, not reinterpreted
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match=r"format 'ai4dl-policy-model/1'.*earlier ai4dl .*refit it with `ai4dl policies`"):
        M.load(d)
    with pytest.raises(ModelError, match="no policy model versions under .*; run `ai4dl policies` first"):
        M.latest_version(tmp_path / "none", "policies")
    # the report draws without a policy model before the first `ai4dl policies`, and says why it drew without one
    cfg = config_under(test_config, tmp_path / "report-lake")
    assert stages.report_policy_model(cfg) == (None, None)
    unused = stages.report_policy_model(cfg.replace(policies={"model": str(d)}))
    assert unused[0] is None and "not used" in unused[1] and "refit it with `ai4dl policies`" in unused[1]
    shutil.copytree(d, Path(cfg.lake.models) / cfg.policies.model_name / "v0001")  # saved, none configured
    saved = stages.report_policy_model(cfg)
    assert saved[0] is None and "refit it with `ai4dl policies`" in saved[1]
    with pytest.raises(ModelError) as err:
        M.check_phase_model(fitted["model"], fitted["path"], "another-phase-model")
    assert PHASE_MODEL in str(err.value) and "another-phase-model" in str(err.value) and "\n" not in str(err.value)


def test_the_gold_tables_are_the_models_held_out_scores(fitted):
    lake, model = fitted["lake"], fitted["model"]
    table = fitted["result"].details["calibration"]
    assert set(table["policy"]) == set(POLICIES)
    deployed = table[table["deployed"]].set_index("resource")["policy"].to_dict()
    assert deployed == model.best  # exactly one deployed policy per resource: the model's best
    assert table[table["resource"] == "mem"]["oom_budget_per_100h"].notna().all()
    assert (table["hours"] > 0).all()
    frontier = lake.read("policy_frontier").toPandas()
    replay = lake.read("policy_replay").toPandas()
    assert set(frontier["pod_id"]) == set(replay["pod_id"])  # the held-out containers
    for (policy, resource), value in model.knob_table().items():  # each policy at its calibrated knob
        rows = replay[(replay["policy"] == policy) & (replay["resource"] == resource)]
        at = frontier[(frontier["policy"] == policy) & (frontier["resource"] == resource)
                      & (frontier["knob"].isna() if value is None else frontier["knob"] == value)]
        assert len(rows) == len(at) > 0 and rows["allocated"].sum() == pytest.approx(at["allocated"].sum())


def test_the_printed_comparison_is_one_table_marking_what_the_stream_deploys(spark, fitted, capsys):
    stages.policies(fitted["cfg"], spark)
    out = capsys.readouterr().out
    assert out.count("service level:") == 1 and "configured parameters" not in out
    marked = [line for line in out.splitlines() if line.startswith("* ")]
    assert sorted(line.split()[1] for line in marked) == ["cpu", "mem"]
    assert {line.split()[2] for line in marked} == set(fitted["model"].best.values())
    assert "OOM kills/100 h" in out and "throttled core-s" in out


def test_a_service_level_no_knob_reaches_is_one_line_and_writes_nothing(spark, cfg, lake, capsys):
    """Every container's CPU demand exceeds its limit once (no allocation above the limit exists): 100 % of steps
    met is out of every policy's reach."""
    from pyspark.sql import functions as F

    from ai4dl.cli import main

    phases = _phases(spark).withColumn(
        "cpu_usage_cores", F.when(F.col("step") == 50, F.col("cpu_num_cores") * 1.5).otherwise(F.col("cpu_usage_cores")))
    lake.overwrite("phases", phases, properties={"ai4dl.model_id": PHASE_MODEL})
    sets = ["--set", f"lake.root={cfg.lake.root}", "--set", f"lake.models={cfg.lake.models}",
            "--set", "policies.interval_steps=5", "--set", "policies.target_fulfilment_cpu=1.0"]
    assert main(["policies", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ai4dl policies: policies.target_fulfilment_cpu: 100% of steps met is reached by no policy's knob"), err
    assert not (M.versioned.versions(cfg.lake.models, "policies")) and not lake.exists("policy_calibration")

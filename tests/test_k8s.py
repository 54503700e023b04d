"""Kubernetes output that can act: every object ``ai4dl recommendations`` writes decodes strictly into the real
Go API types (``tools/k8s-strict``: VerticalPodAutoscaler from the VPA module, Pod, Deployment, StatefulSet from
k8s.io/api), each aimed at what its owner's kind lets change; an unknown field or a malformed quantity fails."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ai4dl.errors import InputError
from ai4dl.policies.k8s import OWNERS, UPDATE_MODES, k8s_name, read_back, render

REC = {"pod_id": "Exec_1", "service": "service1", "cpu_cores": 0.2501, "mem_bytes": 1.5e9, "cpu_num_cores": 4.0,
       "mem_limit": 5.24288e9, "phase": 2, "phase_name": "phase 2", "model_id": "m", "policy_model_id": "p",
       "cpu_policy": "prev.step.rules", "mem_policy": "vpa", "step": 9, "updated_at": "2024-05-01 12:00:00"}
BOUNDS = {"cpu": {"min": 0.025, "max_share_of_limit": 1.0}, "mem": {"min": 262144000.0, "max_share_of_limit": 1.0}}


@pytest.fixture(scope="session")
def k8s_strict(project_root) -> Path:
    """The strict decoder, built once with the machine's Go from the Go module proxy (cached by its sources)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed: the strict decoding into the Kubernetes API types needs it")
    src = project_root / "tools" / "k8s-strict"
    digest = hashlib.sha256(b"".join((src / f).read_bytes() for f in ("go.mod", "go.sum", "main.go"))).hexdigest()[:12]
    binary = project_root / ".cache" / "tools" / f"k8s-strict-{digest}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        subprocess.run([go, "build", "-o", str(tmp), "."], cwd=src, check=True, capture_output=True, timeout=900)
        tmp.rename(binary)
    return binary


def _decode(tool: Path, text: str, tmp_path: Path, kind: str | None = None) -> subprocess.CompletedProcess:
    path = tmp_path / "objects.yaml"
    path.write_text(text)
    return subprocess.run([str(tool), *(["-as", kind] if kind else []), str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("owner", list(OWNERS))
def test_every_vpa_update_mode_decodes_into_the_vpa_api_type(k8s_strict, tmp_path, owner):
    text = "---\n".join(render([REC, {**REC, "pod_id": "exec2"}], "vpa", owner_kind=owner, update_mode=mode,
                               namespace="ml", bounds=BOUNDS) for mode in UPDATE_MODES)
    out = _decode(k8s_strict, text, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{2 * len(UPDATE_MODES)} documents decoded strictly"
    docs = list(yaml.safe_load_all(text))
    assert [d["spec"]["updatePolicy"]["updateMode"] for d in docs[::2]] == list(UPDATE_MODES)
    vpa = docs[0]
    assert vpa["spec"]["targetRef"] == {"apiVersion": OWNERS[owner], "kind": owner, "name": "exec-1"}
    assert vpa["spec"]["recommenders"] == [{"name": "ai4dl"}]  # the cluster's own recommender leaves it alone
    policy = vpa["spec"]["resourcePolicy"]["containerPolicies"][0]
    assert policy["minAllowed"] == {"cpu": "25m", "memory": "262144000"}  # the model's floor
    assert policy["maxAllowed"] == {"cpu": "4000m", "memory": "5242880000"}  # the container's limit
    rec = vpa["status"]["recommendation"]["containerRecommendations"][0]
    assert rec["target"] == rec["uncappedTarget"] == {"cpu": "251m", "memory": "1500000000"}
    assert f"for {owner} exec-1" in text.splitlines()[0]  # each document says what it targets and how to apply it


def test_targets_are_clamped_to_the_models_bounds():
    tiny = {**REC, "cpu_cores": 0.001, "mem_bytes": 6e9}  # under the floor, over the limit
    doc = yaml.safe_load(render([tiny], "vpa", bounds=BOUNDS))
    rec = doc["status"]["recommendation"]["containerRecommendations"][0]
    assert rec["target"] == {"cpu": "25m", "memory": "5242880000"} and rec["uncappedTarget"]["cpu"] == "1m"


def test_a_pod_resize_for_any_owner_and_a_template_patch_only_where_the_owner_allows_it(k8s_strict, tmp_path):
    resize = render([REC, {**REC, "pod_id": "train-job-x7k2p/worker"}], "resize", namespace="ml")
    out = _decode(k8s_strict, resize, tmp_path, "Pod")
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(resize))
    assert docs[1]["spec"]["containers"][0] == {"name": "worker", "resources": {"requests": {"cpu": "251m", "memory": "1500000000"}}}
    assert "kubectl patch pod train-job-x7k2p -n ml --subresource resize" in resize
    for owner in ("Deployment", "StatefulSet"):
        patch = render([REC], "patch", owner_kind=owner)
        out = _decode(k8s_strict, patch, tmp_path, owner)
        assert out.returncode == 0, out.stderr
        template = read_back(yaml.safe_load(patch)["spec"]["template"], "V1PodTemplateSpec")
        assert template.spec.containers[0].resources.limits == {"cpu": "4000m", "memory": "5242880000"}
    with pytest.raises(InputError, match="a Job's pod template cannot be changed after it is created"):
        render([REC], "patch", owner_kind="Job")
    with pytest.raises(InputError, match="update mode 'Sometimes'"):
        render([REC], "vpa", update_mode="Sometimes")
    with pytest.raises(InputError):
        k8s_name("___")


@pytest.mark.parametrize("breakage, message", [
    (lambda t: t.replace("controlledValues:", "controlledValuez:"), 'unknown field "controlledValuez"'),
    (lambda t: t.replace("memory: '1500000000'", "memory: 1.5 GB", 1), "quantities must match"),
    (lambda t: t.replace("updateMode: 'Off'", "updateMode: Sometimes"), 'updateMode "Sometimes"'),
    (lambda t: t.replace("  targetRef:", "  targetRef:\n    namespace: ml", 1), 'unknown field "namespace"'),
])
def test_the_decoder_fails_on_what_the_api_server_would_refuse(k8s_strict, tmp_path, breakage, message):
    text = render([REC], "vpa", bounds=BOUNDS)
    broken = breakage(text)
    assert broken != text
    out = _decode(k8s_strict, broken, tmp_path)
    assert out.returncode == 1 and message in out.stderr, out.stderr

"""Where the live recommendations go: Kubernetes objects built from ``gold/recommendations`` rows, each one aimed
at what its owner's kind lets change.

A training container usually runs in a Job, whose pod template cannot be changed after the Job is created (the
API server refuses the update); a Deployment's or a StatefulSet's template can, and rolls its pods. So
``ai4dl recommendations --format ...`` writes, per container:

``vpa``
    a ``VerticalPodAutoscaler`` (``autoscaling.k8s.io/v1``) whose ``targetRef`` is the owner (``--owner-kind``:
    Job, Deployment, StatefulSet), with any VPA v1 ``updateMode`` (``Off``: publish only; ``Initial``: on pod
    creation; ``Recreate`` / ``Auto``: evict and recreate; ``InPlaceOrRecreate`` / ``InPlace``: resize running
    pods in place, Kubernetes >= 1.33 and VPA >= 1.4). ``spec.recommenders: [{name: ai4dl}]`` tells the cluster's
    default recommender to leave the object alone: ai4dl is its recommender, and the recommendation is its
    ``status`` (target clamped to ``minAllowed``/``maxAllowed``, ``uncappedTarget`` as allocated). ``minAllowed``
    is the policy model's floor (:attr:`ai4dl.policies.model.PolicyModel.bounds`), ``maxAllowed`` the container's
    limit. ``kubectl apply`` writes the spec; the status goes through its subresource
    (``kubectl patch vpa NAME --subresource status --type merge --patch-file``), each document says how.
``resize``
    the body of a pod's ``resize`` subresource (Kubernetes >= 1.33): the container's requests, for
    ``kubectl patch pod NAME --subresource resize --patch-file``. Works whatever the owner, Jobs included.
``patch``
    a strategic-merge patch of a Deployment's or StatefulSet's pod template (requests set, limits kept), for
    ``kubectl patch KIND NAME --type strategic --patch-file``. Refused for a Job: its template is immutable.

Each document is preceded by a comment naming its target and the command that applies it. Quantities are
parsed back with the Kubernetes client (``kubernetes.utils.parse_quantity``) and the core objects read back
through its models before anything is written; ``tests/test_k8s.py`` decodes every document strictly into the
real Go API types (``tools/k8s-strict``), so an unknown field or a malformed quantity fails a test. No cluster
is contacted.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

from ai4dl.errors import InputError

VPA_API = "autoscaling.k8s.io/v1"
UPDATE_MODES = ("Off", "Initial", "Recreate", "Auto", "InPlaceOrRecreate", "InPlace")
OWNERS = {"Job": "batch/v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1"}
FORMATS = ("vpa", "resize", "patch")
RECOMMENDER = "ai4dl"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def k8s_name(value: str) -> str:
    """A DNS-1123 label (lowercase alphanumerics and '-', at most 63 characters) from a container or service id.

    >>> k8s_name("Exec_1.Train")
    'exec-1-train'
    """
    name = re.sub(r"[^a-z0-9-]+", "-", str(value).lower()).strip("-")[:63].strip("-")
    if not name or not _DNS_LABEL.match(name):
        raise InputError(f"cannot make a Kubernetes name of {value!r}")
    return name


def cpu_quantity(cores: float) -> str:
    """Cores as millicores, rounded up (never below the allocation).

    >>> cpu_quantity(1.3111), cpu_quantity(0.0)
    ('1312m', '0')
    """
    milli = int(math.ceil(round(float(cores) * 1000.0, 6)))
    return "0" if milli == 0 else f"{milli}m"


def memory_quantity(value: float) -> str:
    """Bytes, rounded up to a whole byte.

    >>> memory_quantity(1168723595.2)
    '1168723596'
    """
    return str(int(math.ceil(float(value))))


def _known(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _quantities(cpu: Any, mem: Any) -> dict[str, str]:
    """``{"cpu": ..., "memory": ...}`` of the known values, each parsed back by the Kubernetes client."""
    from kubernetes.utils import parse_quantity

    out = {}
    if _known(cpu):
        out["cpu"] = cpu_quantity(cpu)
    if _known(mem):
        out["memory"] = memory_quantity(mem)
    for q in out.values():
        parse_quantity(q)  # raises ValueError on a malformed quantity
    return out


def _names(rec: Mapping[str, Any], container: str | None) -> tuple[str, str]:
    """The owner/pod name and the container name of a recommendation: a ``pod_id`` of the form
    ``<pod>/<container>`` (Prometheus ingest) names both; any other names the workload, and the container is
    ``container``, else the row's service, else ``main``."""
    pod_id = str(rec["pod_id"])
    if "/" in pod_id and container is None:
        pod, name = pod_id.split("/", 1)
        return k8s_name(pod), k8s_name(name)
    return k8s_name(pod_id.split("/", 1)[0]), k8s_name(container or rec.get("service") or "main")


def _annotations(rec: Mapping[str, Any]) -> dict[str, str]:
    keys = ("phase", "phase_name", "phase_since_ts", "next_phase", "next_phase_probability", "cpu_policy",
            "mem_policy", "model_id", "policy_model_id", "step", "ts")
    return {f"ai4dl.io/{k.replace('_', '-')}": str(rec[k]) for k in keys if rec.get(k) is not None and str(rec[k]) != "nan"}


def _clamp(value: Any, lo: Any, hi: Any) -> Any:
    if not _known(value):
        return value
    v = float(value)
    if _known(hi):
        v = min(v, float(hi))
    if _known(lo):
        v = max(v, float(lo))
    return v


def vpa_object(rec: Mapping[str, Any], owner_kind: str = "Job", update_mode: str = "Off", namespace: str | None = None,
               container: str | None = None, bounds: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """A ``VerticalPodAutoscaler`` of one recommendation row, as a plain dict ready for YAML (see the module
    docstring)."""
    owner, name = _names(rec, container)
    floor = {r: (bounds or {}).get(r, {}).get("min") for r in ("cpu", "mem")}
    minimum = _quantities(floor["cpu"], floor["mem"])
    maximum = _quantities(rec.get("cpu_num_cores"), rec.get("mem_limit"))
    uncapped = _quantities(rec.get("cpu_cores"), rec.get("mem_bytes"))
    target = _quantities(_clamp(rec.get("cpu_cores"), floor["cpu"], rec.get("cpu_num_cores")),
                         _clamp(rec.get("mem_bytes"), floor["mem"], rec.get("mem_limit")))
    policy: dict[str, Any] = {"containerName": name, "controlledResources": sorted(target),
                              "controlledValues": "RequestsOnly"}
    if minimum:
        policy["minAllowed"] = minimum
    if maximum:
        policy["maxAllowed"] = maximum
    metadata: dict[str, Any] = {"name": owner, "labels": {"app.kubernetes.io/managed-by": "ai4dl"},
                                "annotations": _annotations(rec)}
    if namespace:
        metadata["namespace"] = namespace
    status: dict[str, Any] = {"recommendation": {"containerRecommendations": [
        {"containerName": name, "target": target, "uncappedTarget": uncapped}]}}
    updated = _rfc3339(rec.get("updated_at"))
    if updated:
        status["conditions"] = [{"type": "RecommendationProvided", "status": "True", "lastTransitionTime": updated}]
    return {
        "apiVersion": VPA_API,
        "kind": "VerticalPodAutoscaler",
        "metadata": metadata,
        "spec": {
            "targetRef": {"apiVersion": OWNERS[owner_kind], "kind": owner_kind, "name": owner},
            "updatePolicy": {"updateMode": update_mode},
            "recommenders": [{"name": RECOMMENDER}],
            "resourcePolicy": {"containerPolicies": [policy]},
        },
        "status": status,
    }


def resize_body(rec: Mapping[str, Any], container: str | None = None) -> dict[str, Any]:
    """The body of a pod's ``resize`` subresource: the container's requests set to the recommendation."""
    _, name = _names(rec, container)
    requests = _quantities(rec.get("cpu_cores"), rec.get("mem_bytes"))
    return {"spec": {"containers": [{"name": name, "resources": {"requests": requests}}]}}


def template_patch(rec: Mapping[str, Any], container: str | None = None) -> dict[str, Any]:
    """A strategic-merge patch of a Deployment's or StatefulSet's pod template: the container's requests set to
    the recommendation, its limits to the container's limits (``cpu_num_cores`` / ``mem_limit``) when known."""
    _, name = _names(rec, container)
    resources: dict[str, Any] = {"requests": _quantities(rec.get("cpu_cores"), rec.get("mem_bytes"))}
    limits = _quantities(rec.get("cpu_num_cores"), rec.get("mem_limit"))
    if limits:
        resources["limits"] = limits
    return {"spec": {"template": {"metadata": {"annotations": _annotations(rec)},
                                  "spec": {"containers": [{"name": name, "resources": resources}]}}}}


def _rfc3339(ts: Any) -> str | None:
    if ts is None or str(ts) in ("NaT", "nan", "None"):
        return None
    import pandas as pd

    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_back(obj: Any, klass: str) -> Any:
    """``obj`` (a plain dict) deserialized into the client's model ``klass`` (e.g. ``"V1PodTemplateSpec"``), as
    the client reads an API server's answer. Works with the client's two ``deserialize`` signatures (a response
    object before v35, text after)."""
    import inspect
    import json

    from kubernetes import client

    api = client.ApiClient()
    text = json.dumps(obj)
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api.deserialize(text, klass, "application/json")

    class _Response:  # older clients read a response's .data
        data = text

    return api.deserialize(_Response(), klass)


def _comment(fmt: str, rec: Mapping[str, Any], owner_kind: str, namespace: str | None, container: str | None) -> str:
    owner, name = _names(rec, container)
    ns = f" -n {namespace}" if namespace else ""
    if fmt == "vpa":
        return (f"# VerticalPodAutoscaler {owner} for {owner_kind} {owner}, container {name}: kubectl apply -f FILE "
                f"(spec); status: kubectl patch vpa {owner}{ns} --subresource status --type merge --patch-file DOC")
    if fmt == "resize":
        return (f"# pod {owner}, container {name} (in-place resize, Kubernetes >= 1.33): "
                f"kubectl patch pod {owner}{ns} --subresource resize --patch-file DOC")
    return (f"# {owner_kind} {owner} pod template, container {name}: "
            f"kubectl patch {owner_kind.lower()} {owner}{ns} --type strategic --patch-file DOC")


def render(records: Iterable[Mapping[str, Any]], fmt: str = "vpa", owner_kind: str = "Job", update_mode: str = "Off",
           namespace: str | None = None, container: str | None = None,
           bounds: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The objects of ``records`` as one multi-document YAML text, each document after a comment naming its
    target and how to apply it (``fmt``: ``vpa``, ``resize`` or ``patch``)."""
    import yaml

    if fmt not in FORMATS:
        raise InputError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if owner_kind not in OWNERS:
        raise InputError(f"owner kind {owner_kind!r} is not one of {', '.join(OWNERS)}")
    if update_mode not in UPDATE_MODES:
        raise InputError(f"update mode {update_mode!r} is not one of the VPA v1 modes {', '.join(UPDATE_MODES)}")
    if fmt == "patch" and owner_kind == "Job":
        raise InputError("a Job's pod template cannot be changed after it is created (the API server refuses the "
                         "patch): use --format resize (in-place pod resize, Kubernetes >= 1.33) or --format vpa")
    parts = []
    for rec in records:
        if fmt == "vpa":
            doc = vpa_object(rec, owner_kind, update_mode, namespace, container, bounds)
            read_back(doc["metadata"], "V1ObjectMeta")
            read_back(doc["spec"]["targetRef"], "V1CrossVersionObjectReference")
        elif fmt == "resize":
            doc = resize_body(rec, container)
            read_back(doc["spec"], "V1PodSpec")
        else:
            doc = template_patch(rec, container)
            read_back(doc["spec"]["template"], "V1PodTemplateSpec")
        parts.append(_comment(fmt, rec, owner_kind, namespace, container) + "\n"
                     + yaml.safe_dump(doc, sort_keys=False))
    return "---\n".join(parts)


__all__ = ["FORMATS", "OWNERS", "UPDATE_MODES", "cpu_quantity", "k8s_name", "memory_quantity", "read_back", "render",
           "resize_body", "template_patch", "vpa_object"]

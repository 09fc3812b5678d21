"""Kubernetes: a preStop hook checkpoints, SIGTERM stops, SIGKILL ends the grace period.

kubelet stops a container in this order: it runs the preStop hook (which counts against
``terminationGracePeriodSeconds``), then sends SIGTERM to PID 1, then SIGKILL when the
grace period is over. ferry's preStop hook is ``ferry checkpoint --all --wait --timeout T``:
the job commits a checkpoint while it still trains (so a SIGKILL later still finds a
recent one); the SIGTERM that follows makes it save once more, at the step it reached, and
exit 85. The pod's
``restartPolicy: OnFailure`` (or the PyTorchJob's) starts it again, and it resumes from the
checkpoint folder on its PersistentVolumeClaim.

The grace period is not visible inside the pod: the manifests pass it as
``FERRY_K8S_GRACE_SECONDS``; ferry compares it with what its measured save time needs
(``required_grace_seconds``) and warns when the pod's is too short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.knobs import K8S_MARGIN_SECONDS, K8S_SAFETY
from ferry.schedulers.base import AdapterDefaults

GRACE_ENV = "FERRY_K8S_GRACE_SECONDS"


def required_grace_seconds(save_seconds: float, step_seconds: float = 0.0) -> int:
    """The ``terminationGracePeriodSeconds`` a job whose checkpoint takes ``save_seconds``
    needs: room for the preStop checkpoint and the stop checkpoint, the training step in
    flight when each is asked for, and a margin."""
    return math.ceil(K8S_SAFETY * (save_seconds + step_seconds) + K8S_MARGIN_SECONDS)


def prestop_command(timeout_seconds: int, ferry: str = "ferry") -> list[str]:
    """The preStop exec hook: checkpoint every ferry job in the container and wait for it."""
    return [ferry, "checkpoint", "--all", "--wait", "--timeout", str(timeout_seconds)]


@dataclass(frozen=True)
class KubernetesAdapter(AdapterDefaults):
    grace: float | None
    """The pod's terminationGracePeriodSeconds, when the manifest passed it."""
    name: str = "kubernetes"
    stop_signal: str = "SIGTERM"
    # job_id(): none of its own; pod names change when a controller replaces a pod, so the
    # manifests pass --job-id.

    def job_id(self) -> str | None:
        return None  # pod names change when a controller replaces a pod: manifests set --job-id

    def worker_defaults(self) -> dict[str, Any]:
        return {"grace_seconds": self.grace} if self.grace else {}

    def grace_warning(self, save_seconds: float) -> str | None:
        needed = required_grace_seconds(save_seconds)
        if self.grace is None:  # not passed by the manifest: nothing to compare (and no noise)
            return None
        if self.grace < needed:
            return (
                f"ferry: warning: terminationGracePeriodSeconds={self.grace:g} is too short: a checkpoint "
                f"took {save_seconds:.1f} s, so a preStop checkpoint plus a stop checkpoint need "
                f"{needed} s; set terminationGracePeriodSeconds (and {GRACE_ENV}) to at least {needed}"
            )
        return None


def detect(env: Mapping[str, str]) -> KubernetesAdapter | None:
    if not env.get("KUBERNETES_SERVICE_HOST") and not env.get("FERRY_SCHEDULER_FORCED"):
        return None
    raw = env.get(GRACE_ENV)
    try:
        grace = float(raw) if raw else None
    except ValueError:
        grace = None
    return KubernetesAdapter(grace=grace)


# ------------------------------------------------------------------ manifests


@dataclass(frozen=True, kw_only=True)
class ManifestSpec:
    """What the example Pod and PyTorchJob say; every field has the example's default."""

    name: str = "ferry-train"
    """The Pod's / PyTorchJob's name, also the ferry job id and its checkpoint folder."""
    image: str = "ghcr.io/example/train:latest"
    command: tuple[str, ...] = ("python", "train.py")
    grace_seconds: int = 120
    """terminationGracePeriodSeconds; ``required_grace_seconds`` says what a job needs."""
    claim: str = "ferry-checkpoints"
    """The PersistentVolumeClaim holding the checkpoints, mounted at ``mount``."""
    mount: str = "/checkpoints"
    storage: str = "50Gi"
    gpus: int = 1
    """GPUs per pod (per node); on many nodes, torchrun's processes per node too."""
    nodes: int = 1
    """Pods of a PyTorchJob, one node each (a Master and ``nodes - 1`` Workers). Above 1,
    ``command`` is the training script and its arguments, which torchrun runs on every node,
    and the claim must be one every node mounts (ReadWriteMany)."""

    def __post_init__(self) -> None:
        if self.grace_seconds < K8S_MARGIN_SECONDS + 5:
            raise ValueError(
                f"grace_seconds={self.grace_seconds} leaves no room to checkpoint: use at least "
                f"{int(K8S_MARGIN_SECONDS) + 5}, or required_grace_seconds(save seconds)"
            )


def _container(spec: ManifestSpec) -> dict[str, Any]:
    hook_timeout = spec.grace_seconds // 2
    run = ["ferry", "run", "--job-id", spec.name, "--dir", f"{spec.mount}/{spec.name}"]
    run += ["--grace", str(spec.grace_seconds - hook_timeout - 5), "--"]
    if spec.nodes > 1:
        # The training operator sets PET_NNODES, PET_NODE_RANK and PET_NPROC_PER_NODE, which
        # torchrun (and ferry run) read, and MASTER_ADDR/MASTER_PORT, which kubelet expands here.
        run += ["torchrun", "--master-addr", "$(MASTER_ADDR)", "--master-port", "$(MASTER_PORT)"]
    run += list(spec.command)
    return {
        "name": "train",
        "image": spec.image,
        "command": run,
        "env": [{"name": GRACE_ENV, "value": str(spec.grace_seconds)}],
        "lifecycle": {"preStop": {"exec": {"command": prestop_command(hook_timeout)}}},
        "resources": {"limits": {"nvidia.com/gpu": str(spec.gpus)}},
        "volumeMounts": [{"name": "checkpoints", "mountPath": spec.mount}],
    }


def _pod_spec(spec: ManifestSpec) -> dict[str, Any]:
    return {
        # 85 ("checkpointed, resume me") is a non-zero exit: OnFailure restarts the container.
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": spec.grace_seconds,
        "containers": [_container(spec)],
        "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.claim}}],
    }


def pvc_manifest(spec: ManifestSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": spec.claim},
        "spec": {
            # every node of a job on many nodes writes its ranks' parts of each checkpoint there
            "accessModes": ["ReadWriteMany" if spec.nodes > 1 else "ReadWriteOnce"],
            "resources": {"requests": {"storage": spec.storage}},
        },
    }


def pod_manifest(spec: ManifestSpec) -> dict[str, Any]:
    """A pure function: the example Pod (a dict, as ``kubectl apply`` reads it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": spec.name, "labels": {"app": spec.name}},
        "spec": _pod_spec(spec),
    }


def pytorchjob_manifest(spec: ManifestSpec) -> dict[str, Any]:
    """A pure function: the example Kubeflow PyTorchJob: one Master replica, and ``nodes - 1``
    Workers on many nodes (one ``ferry run`` per pod, torchrun under each)."""
    replicas: dict[str, Any] = {"Master": _replica(spec, 1)}
    if spec.nodes > 1:
        replicas["Worker"] = _replica(spec, spec.nodes - 1)
    body: dict[str, Any] = {"runPolicy": {"backoffLimit": 20}}
    if spec.nodes > 1:
        body["nprocPerNode"] = str(spec.gpus)
    body["pytorchReplicaSpecs"] = replicas
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.name},
        "spec": body,
    }


def _replica(spec: ManifestSpec, count: int) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": spec.name}}, "spec": _pod_spec(spec)}
    # The training operator names the container "pytorch".
    template["spec"]["containers"][0]["name"] = "pytorch"
    return {"replicas": count, "restartPolicy": "OnFailure", "template": template}


def render(*manifests: dict[str, Any]) -> str:
    """YAML documents, as recorded under examples/kubernetes (needs PyYAML)."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with the kubernetes client
        raise ImportError("rendering manifests needs PyYAML: pip install pyyaml") from None
    header = "# Generated by ferry.schedulers.kubernetes (see docs/schedulers.md).\n"
    body = "---\n".join(yaml.safe_dump(m, sort_keys=False, default_flow_style=False) for m in manifests)
    return header + body

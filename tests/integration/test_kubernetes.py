"""Kubernetes without a cluster: the example manifests validated against the API models of
the ``kubernetes`` client, and kubelet's stop sequence replayed with real processes:
the preStop command, then SIGTERM, then SIGKILL once the grace period is over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ferry.schedulers import kubernetes as k8s
from ferry.schedulers.templates import EXAMPLES

from trainrun import SCRIPTS, assert_same, env_for, run
from trainrun import job_status as status

pytestmark = pytest.mark.integration
FERRY = [sys.executable, "-c", "from ferry.cli import main; main()"]
EXAMPLES_DIR = Path(__file__).parents[2] / "examples"


# ------------------------------------------------------------------ manifests


def _model(data: dict[str, Any], kind: str) -> Any:
    """``data`` as the client's model ``kind``, and back: a field the API does not know, a
    wrong type or a missing required field fails here."""
    client = pytest.importorskip("kubernetes.client", reason="pip install -e '.[test]' (kubernetes)")
    api = client.ApiClient()

    class Response:
        def __init__(self) -> None:
            self.data = json.dumps(data)

    model = api.deserialize(Response(), kind)
    assert api.sanitize_for_serialization(model) == data, f"fields the {kind} model does not know"
    return model


@pytest.mark.parametrize(
    "name", ["kubernetes/pod.yaml", "kubernetes/pytorchjob.yaml", "kubernetes/pytorchjob-nodes.yaml"]
)
def test_recorded_manifests_validate_against_the_api_models(name: str) -> None:
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((EXAMPLES_DIR / name).read_text()))
    assert (EXAMPLES_DIR / name).read_text() == EXAMPLES[name]()
    kinds = {d["kind"]: d for d in docs}
    _model(kinds["PersistentVolumeClaim"], "V1PersistentVolumeClaim")
    if "Pod" in kinds:
        pod = _model(kinds["Pod"], "V1Pod")
    else:  # a CRD: its pod template is a core PodTemplateSpec
        replicas = kinds["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]
        for replica in replicas.values():  # a Master, and Workers on many nodes: one pod per node
            assert replica["restartPolicy"] == "OnFailure"
            _model(replica["template"], "V1PodTemplateSpec")
        pod = _model(replicas["Master"]["template"], "V1PodTemplateSpec")
        if "Worker" in replicas:  # every node mounts the claim: ReadWriteMany
            assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
            assert replicas["Master"]["template"] == replicas["Worker"]["template"]
    grace = pod.spec.termination_grace_period_seconds
    container = pod.spec.containers[0]
    hook = container.lifecycle.pre_stop._exec.command
    assert hook[:4] == ["ferry", "checkpoint", "--all", "--wait"]
    run_grace = float(container.command[container.command.index("--grace") + 1])
    # preStop timeout + ferry run's own grace stay inside the pod's grace period.
    assert int(hook[-1]) + run_grace < grace
    assert {e.name: e.value for e in container.env}[k8s.GRACE_ENV] == str(grace)
    claim = pod.spec.volumes[0].persistent_volume_claim.claim_name
    assert claim == kinds["PersistentVolumeClaim"]["metadata"]["name"]


# ------------------------------------------------------------------ kubelet, replayed


def test_kubelet_sequence_prestop_sigterm_sigkill_then_exact_resume(tmp_path: Path, reference: Path) -> None:
    grace = 40
    home, out, ck = tmp_path / "home", tmp_path / "run", tmp_path / "pvc" / "train"
    env = env_for(home, KUBERNETES_SERVICE_HOST="10.0.0.1", **{k8s.GRACE_ENV: str(grace)})
    container = [*FERRY, "run", "--no-autotrack", "--job-id", "train", "--dir", str(ck), "--grace", "15"]
    train = [sys.executable, str(SCRIPTS / "train_explicit.py"), "--out", str(out)]
    job = home / "jobs" / "train"
    pod = subprocess.Popen(
        [*container, "--", *train, "--sleep", "0.05"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while status(job).get("step", 0) < 5:
            assert pod.poll() is None and time.monotonic() < deadline, "the job never reached step 5"
            time.sleep(0.05)
        # kubelet: the preStop hook runs first, and its time counts against the grace period.
        started = time.monotonic()
        hook = k8s.prestop_command(grace // 2)
        prestop = subprocess.run([*FERRY, *hook[1:]], env=env, capture_output=True, text=True, timeout=grace)
        assert prestop.returncode == 0, prestop.stderr + prestop.stdout
        committed = [c["step"] for c in status(job).get("checkpoints", [])]
        assert committed, status(job)
        assert pod.poll() is None, "preStop must not stop the job: SIGTERM does"
        # Then SIGTERM to PID 1, then SIGKILL when the grace period is over.
        pod.send_signal(signal.SIGTERM)
        try:
            _, err = pod.communicate(timeout=max(1.0, grace - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            pod.kill()
            raise AssertionError("kubelet would have SIGKILLed the job: it overstayed its grace") from None
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait()
    assert pod.returncode == 85, err
    assert "too short" not in err  # the grace period fits this job's measured saves
    # restartPolicy OnFailure: a new container process on the same volume resumes exactly.
    again = subprocess.run([*container, "--", *train], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "ferry: resumed from" in again.stderr
    assert_same(reference, out)


def test_a_too_short_grace_period_is_reported_with_what_the_job_needs(tmp_path: Path) -> None:
    env = env_for(
        tmp_path / "home",
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        FERRY_DIR=str(tmp_path / "ck"),
        FERRY_EVERY_STEPS="10",
        **{k8s.GRACE_ENV: "3"},
    )
    done = run("train_explicit.py", tmp_path / "run", ["--epochs", "1"], env)
    assert done.returncode == 0, done.stderr
    assert "terminationGracePeriodSeconds=3 is too short" in done.stderr, done.stderr
    needed = int(done.stderr.split("to at least ")[1].split()[0])
    assert needed >= k8s.required_grace_seconds(0.0) > 3

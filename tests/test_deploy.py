"""deploy/: what can be checked without Docker or Kubernetes (neither runs on this machine).

The manifests parse and are the Dask operator's kinds; every pod runs the one image; the
image's entrypoint is the package's ``dpsub`` console script; the DaskJob's job-runner
arguments are accepted by ``dpsub``'s own parser and parameter checks; the scheduler and
worker arguments are accepted by ``dask scheduler`` / ``dask worker``; the image pins every
runtime dependency of pyproject.toml at a version its specifier allows.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from dpsub_dist.cli import build_parser
from dpsub_dist.job import EstimateConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPERATOR_API = "kubernetes.dask.org/v1"


def manifest(name: str) -> dict:
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))
    assert len(docs) == 1
    return docs[0]


def pod_specs(resource: dict) -> dict[str, dict]:
    spec = resource["spec"]
    cluster = spec["cluster"]["spec"] if resource["kind"] == "DaskJob" else spec
    pods = {"worker": cluster["worker"]["spec"], "scheduler": cluster["scheduler"]["spec"]}
    if resource["kind"] == "DaskJob":
        pods["job"] = spec["job"]["spec"]
    return pods


def containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def container(pod: dict, name: str) -> dict:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def lock() -> dict[str, str]:
    pins = {}
    for line in (DEPLOY / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[A-Za-z0-9_.\-]+", name), f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = version
    return pins


@pytest.mark.parametrize(
    "name, kind", [("daskjob.yaml", "DaskJob"), ("daskcluster.yaml", "DaskCluster")]
)
def test_manifests_are_dask_operator_resources(name, kind):
    resource = manifest(name)
    assert resource["apiVersion"] == OPERATOR_API and resource["kind"] == kind
    pods = pod_specs(resource)
    assert container(pods["worker"], "worker") and container(pods["scheduler"], "scheduler")
    service = (resource["spec"]["cluster"]["spec"] if kind == "DaskJob" else resource["spec"])[
        "scheduler"
    ]["service"]
    # The operator names a DaskJob's cluster after the job; the service must select it.
    assert service["selector"]["dask.org/cluster-name"] == resource["metadata"]["name"]
    assert {p["port"] for p in service["ports"]} == {8786, 8787}


def test_every_pod_runs_the_one_image():
    images = {
        c["image"]
        for name in ("daskjob.yaml", "daskcluster.yaml")
        for pod in pod_specs(manifest(name)).values()
        for c in containers(pod)
    }
    assert len(images) == 1 and ":" in images.pop()


def test_cluster_for_interactive_use_matches_the_job_cluster():
    job, cluster = pod_specs(manifest("daskjob.yaml")), pod_specs(manifest("daskcluster.yaml"))
    for role in ("worker", "scheduler"):
        assert container(job[role], role) == container(cluster[role], role)


def test_image_entrypoint_is_the_packages_console_script():
    assert re.search(r'^ENTRYPOINT \["dpsub"\]$', dockerfile(), re.M)
    assert PYPROJECT["project"]["scripts"]["dpsub"] == "dpsub_dist.cli:main"
    (script,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "dpsub"]
    assert callable(script.load()) and script.value == "dpsub_dist.cli:main"
    # The job runner relies on that entrypoint: it gives arguments, not a command.
    assert "command" not in container(pod_specs(manifest("daskjob.yaml"))["job"], "job")


def test_job_runner_arguments_are_accepted_by_dpsub():
    resource = manifest("daskjob.yaml")
    runner = container(pod_specs(resource)["job"], "job")
    args = build_parser().parse_args(runner["args"])
    assert args.command == "estimate"
    assert args.scheduler == "$(DASK_SCHEDULER_ADDRESS)"  # injected by the operator
    assert args.input.startswith("s3://") and args.out.startswith("s3://")
    config = EstimateConfig(rank=args.rank, epsilon=args.epsilon, delta=args.delta, seed=args.seed)
    config.validate()
    # The init container waits for this job's scheduler service.
    (wait,) = pod_specs(resource)["job"]["initContainers"]
    assert f"tcp://{resource['metadata']['name']}-scheduler:8786" in " ".join(wait["command"])


def test_scheduler_and_worker_arguments_are_accepted_by_dask():
    from distributed.cli.dask_scheduler import main as dask_scheduler
    from distributed.cli.dask_worker import main as dask_worker

    pods = pod_specs(manifest("daskjob.yaml"))
    commands = {"scheduler": dask_scheduler, "worker": dask_worker}
    for role, cli in commands.items():
        spec = container(pods[role], role)
        assert spec["command"] == ["dask"] and spec["args"][0] == role
        cli.make_context(f"dask {role}", list(spec["args"][1:]))  # raises on a bad option
    assert metadata.entry_points(group="console_scripts", name="dask")


def test_image_pins_every_runtime_dependency_of_pyproject():
    pins = lock()
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned: run deploy/lock.py (see its docstring)"
        assert Version(pins[name]) in requirement.specifier, f"{name}=={pins[name]} vs {text}"
        for extra in requirement.extras:  # dask[distributed,...] pins what the extra pulls in
            needed = [
                Requirement(r)
                for r in metadata.requires(requirement.name) or []
                if "extra ==" in r and Requirement(r).marker.evaluate({"extra": extra})
            ]
            assert needed, f"{requirement.name}[{extra}] pulls in nothing?"
            for sub in needed:
                assert canonicalize_name(sub.name) in pins, f"{sub.name} (from {text}) not pinned"
    assert "pytest" not in pins and "moto" not in pins  # dev tools stay out of the image


def test_dockerfile_pins_base_image_and_build_tools():
    text = dockerfile()
    (base,) = re.findall(r"^FROM (\S+)$", text, re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base
    python = re.search(r"python:(\d+\.\d+)", base).group(1)
    assert (
        Version(python) in Requirement(f"python{PYPROJECT['project']['requires-python']}").specifier
    )
    (tools,) = re.findall(r"^RUN pip install (pip==\S+ setuptools==\S+)$", text, re.M)
    setuptools = tools.split("setuptools==")[1]
    (backend,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert Version(setuptools) in Requirement(backend).specifier
    assert "pip install --no-deps -r deploy/requirements.lock" in text
    assert "COPY deploy/requirements.lock" in text
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text()
    assert "!dpsub_dist/**" in ignored and "!deploy/requirements.lock" in ignored

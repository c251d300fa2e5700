"""deploy/: the manifests and the image recipe, checked without a Kubernetes cluster.

The manifests validate against the Dask operator's CRD schemas of the pinned dask-kubernetes
(as the Helm chart of the same version, which deploy/README.md installs, installs them),
their pod, service, ConfigMap and CronJob specs against the Kubernetes core schemas of a
pinned Kubernetes version (kubernetes-validate, offline), and their values against the
rules the API server applies and those schemas do not carry (quantities, enums, ports,
probe ports and paths); every pod runs the one image; the
image's entrypoint is the package's ``dpsub`` console script; the DaskJob's job-runner
arguments are accepted by ``dpsub``'s own parser and parameter checks; the scheduler and
worker arguments are accepted by ``dask scheduler`` / ``dask worker``; the image pins every
runtime dependency of pyproject.toml at a version its specifier allows.
"""

from __future__ import annotations

import functools
import re
import tomllib
from importlib import metadata
from pathlib import Path

import dask_kubernetes
import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from dpsub_dist.cli import build_parser
from dpsub_dist.job import EstimateConfig, validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPERATOR_API = "kubernetes.dask.org/v1"
OPERATOR_CRDS = (
    Path(dask_kubernetes.__file__).parent / "operator/deployment/helm/dask-kubernetes-operator/crds"
)
KUBERNETES_VERSION = "1.33.0"
"""The Kubernetes API the manifests are checked against (its schemas ship with the pinned
kubernetes-validate): an API server of 1.33 or later accepts them (CronJob timeZone and
Job podFailurePolicy are GA since 1.27 and 1.31)."""
README = (DEPLOY / "README.md").read_text()


def manifest(name: str) -> dict:
    (doc,) = manifests(name)
    return doc


def manifests(name: str) -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()))


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


def strict(schema: dict) -> dict:
    """A CRD's structural schema as the API server applies it under strict field validation
    (kubectl's default): unknown fields are errors, ``nullable`` admits null."""
    schema = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema:
        schema["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        schema.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = strict(schema[key])
    if schema.pop("nullable", False):
        schema["type"] = [schema["type"], "null"]
    return schema


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(crd_schema(kind))


def crd_schema(kind: str) -> dict:
    """The operator's published schema for ``kind`` at our apiVersion, made strict."""
    crd = yaml.safe_load((OPERATOR_CRDS / f"{kind.lower()}.yaml").read_text())
    group, version = OPERATOR_API.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = strict(served["schema"]["openAPIV3Schema"])
    schema["properties"] |= {
        "apiVersion": {"const": OPERATOR_API},
        "kind": {"const": kind},
        "metadata": {"type": "object"},  # checked below as core ObjectMeta
    }
    return schema


def crd_errors(resource: dict) -> list[str]:
    """Every way ``resource`` breaks the operator's CRD schema; [] when it is valid."""
    crd = crd_validator(resource["kind"])
    return [f"{e.json_path}: {e.message}" for e in crd.iter_errors(resource)]


def core_errors(resource: dict) -> list[str]:
    """Every way the pods and the scheduler service that ``resource`` templates break the
    Kubernetes core schemas (strict: unknown fields are errors); [] when they are valid."""
    spec = resource["spec"]
    cluster = spec["cluster"]["spec"] if resource["kind"] == "DaskJob" else spec
    bodies = [("Pod", role, pod) for role, pod in pod_specs(resource).items()]
    bodies.append(("Service", "scheduler", cluster["scheduler"]["service"]))
    errors = []
    for kind, role, body in bodies:
        name = f"{resource['metadata']['name']}-{role}"
        wrapped = {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {**resource["metadata"], "name": name},
            "spec": body,
        }
        try:
            kubernetes_validate.validate(wrapped, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{kind} {role}: {'.'.join(map(str, e.path))}: {e.message}")
    return errors


QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
"""A resource quantity as the API server parses it (k8s.io/apimachinery resource.Quantity)."""
PORT_NAME = re.compile(r"(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")
"""A named port (IANA_SVC_NAME): at most 15 characters, lower case, digits, inner '-'."""
ENUMS = {
    "imagePullPolicy": {"Always", "IfNotPresent", "Never"},
    "restartPolicy": {"Always", "OnFailure", "Never"},
    "protocol": {"TCP", "UDP", "SCTP"},
    "concurrencyPolicy": {"Allow", "Forbid", "Replace"},
    "action": {"FailJob", "FailIndex", "Ignore", "Count"},
    "operator": {"In", "NotIn"},
}
"""Fields whose values the API server restricts to a set (k8s.io/api core and batch v1)."""
PROBES = ("readinessProbe", "livenessProbe", "startupProbe")


def port_errors(where: str, port) -> list[str]:
    if isinstance(port, int) and not isinstance(port, bool):
        return [] if 1 <= port <= 65535 else [f"{where}: port {port} is not in 1..65535"]
    if isinstance(port, str) and PORT_NAME.fullmatch(port):
        return []
    return [f"{where}: {port!r} is not a port number or an IANA port name"]


def value_errors(node, where: str = "") -> list[str]:
    """Every value in ``node`` (a manifest or part of one) the API server would refuse
    although the schemas accept it: quantities, enums, port numbers and names, probe
    ports that name no port of their container, probe paths that are not absolute."""
    errors = []
    if isinstance(node, list):
        for i, item in enumerate(node):
            errors += value_errors(item, f"{where}[{i}]")
        return errors
    if not isinstance(node, dict):
        return errors
    for key, value in node.items():
        at = f"{where}.{key}"
        if key in ("requests", "limits") and isinstance(value, dict):
            errors += [
                f"{at}.{name}: {amount!r} is not a quantity (e.g. 8Gi, 500m)"
                for name, amount in value.items()
                if not (isinstance(amount, int) or QUANTITY.fullmatch(str(amount)))
            ]
        elif key in ENUMS and isinstance(value, str) and value not in ENUMS[key]:
            errors.append(f"{at}: {value!r} is not one of {sorted(ENUMS[key])}")
        elif key in ("containerPort", "port", "targetPort") and not isinstance(value, dict):
            errors += port_errors(at, value)
        elif key == "ports" and isinstance(value, list):
            for i, port in enumerate(value):
                if isinstance(port, dict) and "name" in port:
                    errors += port_errors(f"{at}[{i}].name", port["name"])
        errors += value_errors(value, at)
    if "image" in node and "name" in node:  # a container: its probes' ports and paths
        names = {p.get("name") for p in node.get("ports", [])}
        for probe in PROBES:
            get = node.get(probe, {}).get("httpGet")
            if get is None:
                continue
            if isinstance(get.get("port"), str) and get["port"] not in names:
                errors.append(f"{where}.{probe}: port {get['port']!r} names no port of it")
            if not str(get.get("path", "/")).startswith("/"):
                errors.append(f"{where}.{probe}: path {get['path']!r} does not start with /")
    return errors


def validation_errors(resource: dict) -> list[str]:
    """The operator's schema first (the core check walks the shape it guarantees)."""
    return crd_errors(resource) or core_errors(resource) + value_errors(resource)


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


@pytest.mark.parametrize("name", ["daskjob.yaml", "daskcluster.yaml"])
def test_manifests_validate_against_operator_and_kubernetes_schemas(name):
    assert validation_errors(manifest(name)) == []


def _set(resource: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    node = resource
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value


def _rename(resource: dict, path: str, new: str) -> None:
    *parents, last = path.split(".")
    node = resource
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[new] = node.pop(last)


JOB_CONTAINER = "spec.job.spec.containers.0"
WORKER = "spec.cluster.spec.worker"


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (
            lambda r: _rename(r, f"{JOB_CONTAINER}.imagePullPolicy", "imagePullPolicyy"),
            "imagePullPolicyy",
        ),
        (lambda r: _rename(r, "spec.job.spec.restartPolicy", "restartpolicy"), "restartpolicy"),
        (lambda r: _rename(r, "spec.cluster", "clusters"), "clusters"),
        (lambda r: _set(r, f"{WORKER}.replicas", "four"), "'four' is not of type 'integer'"),
        (lambda r: _set(r, f"{JOB_CONTAINER}.args", "estimate s3://x/"), "is not of type 'array'"),
        (
            lambda r: _set(r, f"{WORKER}.spec.containers.0.ports.0.containerPort", "8788"),
            "containerPort",
        ),
        (lambda r: r["spec"]["job"]["spec"].pop("containers"), "'containers' is a required"),
    ],
    ids=[
        "typo-container",
        "typo-pod",
        "typo-job",
        "replicas-str",
        "args-str",
        "port-str",
        "no-containers",
    ],
)
def test_broken_manifest_fails_validation(breakage, expected):
    resource = manifest("daskjob.yaml")
    breakage(resource)
    errors = validation_errors(resource)
    assert any(expected in e for e in errors), errors


SCHEDULER = "spec.cluster.spec.scheduler.spec.containers.0"


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (f"{WORKER}.spec.containers.0.resources.limits.memory", "8 GB", "is not a quantity"),
        (f"{JOB_CONTAINER}.resources.requests.cpu", "one", "is not a quantity"),
        (f"{JOB_CONTAINER}.imagePullPolicy", "Sometimes", "'Sometimes' is not one of"),
        ("spec.job.spec.restartPolicy", "OnError", "'OnError' is not one of"),
        (f"{WORKER}.spec.containers.0.ports.0.protocol", "HTTP", "'HTTP' is not one of"),
        (f"{WORKER}.spec.containers.0.ports.0.containerPort", 70000, "not in 1..65535"),
        ("spec.cluster.spec.scheduler.service.ports.0.port", 0, "not in 1..65535"),
        (f"{SCHEDULER}.ports.1.name", "Dashboard_HTTP", "not a port number or an IANA"),
        (f"{SCHEDULER}.readinessProbe.httpGet.port", "dashboard", "names no port of it"),
        (f"{SCHEDULER}.livenessProbe.httpGet.path", "health", "does not start with /"),
    ],
    ids=[
        "memory-8-GB",
        "cpu-one",
        "pull-sometimes",
        "restart-onerror",
        "protocol-http",
        "port-70000",
        "service-port-0",
        "port-name",
        "probe-port-name",
        "probe-path",
    ],
)
def test_manifest_with_a_bad_value_fails_validation(path, value, expected):
    """Values the schemas of kubernetes-validate accept but an API server refuses."""
    resource = manifest("daskjob.yaml")
    assert validation_errors(resource) == []
    _set(resource, path, value)
    errors = validation_errors(resource)
    assert any(expected in e for e in errors), errors


def daily() -> tuple[dict, dict]:
    config, cron = manifests("dpsub-daily.yaml")
    assert (config["kind"], cron["kind"]) == ("ConfigMap", "CronJob")
    return config, cron


def test_daily_job_manifests_validate_and_mount_the_job_file_from_the_configmap():
    config, cron = daily()
    for resource in (config, cron):
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        assert value_errors(resource) == []
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    (mount,) = runner["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    (job_file,) = config["data"]
    assert mount["mountPath"] == "/etc/dpsub" and job_file == "events-basis.yaml"
    assert pod["securityContext"]["runAsUser"] == 1000  # the image's user
    assert runner["image"] == container(pod_specs(manifest("daskjob.yaml"))["job"], "job")["image"]


def test_daily_job_runs_an_accepted_dpsub_run_on_the_interactive_cluster(tmp_path):
    """The CronJob's shell line is ``dpsub run`` of the mounted job file with a dated run id;
    the job file in the ConfigMap is valid and names the DaskCluster's scheduler service."""
    import shlex

    from dpsub_dist.jobfile import load_job

    config, cron = daily()
    (runner,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert runner["command"] == ["/bin/sh", "-c"]
    (line,) = runner["args"]
    assert '"events-basis-$(date -u +%F)"' in line
    argv = shlex.split(line.replace("$(date -u +%F)", "2024-06-01"))
    assert argv[:2] == ["exec", "dpsub"]
    args = build_parser().parse_args(argv[2:])
    assert args.command == "run" and args.run_id == "events-basis-2024-06-01"
    assert args.job == "/etc/dpsub/events-basis.yaml"
    (tmp_path / "events-basis.yaml").write_text(config["data"]["events-basis.yaml"])
    job = load_job(tmp_path / "events-basis.yaml")
    cluster = manifest("daskcluster.yaml")["metadata"]["name"]
    assert job.scheduler == f"tcp://{cluster}-scheduler:8786"
    assert job.ledger.startswith("postgresql://")  # outside the pods, as the README says
    rules = cron["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    (final,) = [r for r in rules if r["action"] == "FailJob"]
    assert final["onExitCodes"]["operator"] == "NotIn"
    assert sorted(final["onExitCodes"]["values"]) == [0, 1, 5]  # only 1 and 5 are retried


def test_validation_uses_the_pinned_versions_the_readme_names():
    """pyproject pins dask-kubernetes and kubernetes-validate; the installed ones are those,
    and the README installs the operator chart of that dask-kubernetes release (the chart's
    CRDs are the package's)."""
    extra = PYPROJECT["project"]["optional-dependencies"]["dev"]
    dev = {canonicalize_name(Requirement(r).name): r for r in extra}
    for name in ("dask-kubernetes", "kubernetes-validate"):
        (pinned,) = re.findall(r"==(\S+)", dev[name])
        assert metadata.version(name) == pinned, f"{name}: installed {metadata.version(name)}"
    operator = metadata.version("dask-kubernetes")
    assert f"OPERATOR_VERSION={operator}" in README
    assert f"Kubernetes {KUBERNETES_VERSION.rsplit('.', 1)[0]}" in README
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


def test_core_schema_alone_catches_a_typo_in_a_pod_spec():
    resource = manifest("daskcluster.yaml")
    _rename(resource, "spec.scheduler.spec.containers.0.readinessProbe", "readinesProbe")
    errors = core_errors(resource)
    assert any("Pod scheduler" in e and "readinesProbe" in e for e in errors), errors


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
    validate(config)
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
    # The image runs the ledgered runner (dpsub run --ledger postgresql://) and serves the
    # Dask dashboard: the postgres and dashboard extras are part of its runtime.
    extras = PYPROJECT["project"]["optional-dependencies"]
    for text in [*PYPROJECT["project"]["dependencies"], *extras["postgres"], *extras["dashboard"]]:
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


def test_image_runs_as_uid_1000_with_a_health_check_the_readme_describes():
    text = dockerfile()
    assert re.search(r"^RUN useradd --create-home --uid 1000 --user-group dpsub$", text, re.M)
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert user == "1000:1000" and text.rindex("USER ") > text.rindex("RUN ")  # root steps first
    (health,) = re.findall(r"^HEALTHCHECK .*\n.*$", text, re.M)
    assert "/health" in health and "DPSUB_HEALTH_PORT" in health
    assert "--format docker" in (DEPLOY / "build-image.sh").read_text()  # OCI drops HEALTHCHECK
    cluster = (DEPLOY / "cluster.sh").read_text()
    assert cluster.count("DPSUB_HEALTH_PORT=") == 2  # the scheduler's and each worker's port
    assert "--no-healthcheck" in cluster  # dpsub's own containers serve no HTTP
    assert "uid 1000, gid 1000" in README and "`dpsub` (uid 1000, gid 1000)" in README


def test_readme_states_the_python_of_each_base():
    """docker build runs the FROM line's Python; build-image.sh runs Debian bookworm's."""
    (base,) = re.findall(r"^FROM python:(\d+\.\d+\.\d+)-slim-bookworm$", dockerfile(), re.M)
    assert f"(Python {base})" in README
    script = (DEPLOY / "build-image.sh").read_text()
    assert "BASE=${BASE:-localhost/debian-python:bookworm}" in script
    assert "(`python3`, **3.11.2**)" in README  # bookworm's python3 package: 3.11.2-1+b1


def other_version_environment(tmp: Path) -> tuple[Path, str]:
    """A virtualenv whose *installed* dpsub_dist is a copy of this tree at another version
    (built as a wheel by pip, fetching the build backend from the index, and installed, not
    editable); dask and its closure come from this
    virtualenv's site-packages through a path entry (whose own .pth files, such as the
    editable hook of this dpsub_dist, are not run). Returns its python and the version."""
    import shutil
    import site
    import subprocess
    import sys
    import venv

    source = tmp / "src"
    shutil.copytree(ROOT / "dpsub_dist", source / "dpsub_dist")
    shutil.copy(ROOT / "README.md", source)
    ours = PYPROJECT["project"]["version"]
    other = f"{ours}.post1"
    text = (ROOT / "pyproject.toml").read_text()
    (source / "pyproject.toml").write_text(
        text.replace(f'version = "{ours}"', f'version = "{other}"', 1)
    )
    env = tmp / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    target = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    (target / "shared-closure.pth").write_text(site.getsitepackages()[0] + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    subprocess.run([*install, "--no-deps", str(source)], check=True, timeout=600)
    return python, other


def test_run_refuses_a_cluster_whose_worker_runs_another_dpsub_dist(tmp_path):
    import subprocess
    import sys

    from daskprocs import command_line_cluster

    from dpsub_dist.synth import generate

    python, other = other_version_environment(tmp_path / "other")
    installed = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m, dpsub_dist as d; "
            "print(m.version('dpsub_dist'), d.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert installed[0] == other and str(ROOT) not in installed[1]  # really another install
    data = tmp_path / "data"
    generate(data, rows=2_000, dim=4, rank=1, gamma=0.1, partitions=2, seed=1)
    with command_line_cluster(tmp_path / "dask", workers=1) as cluster:
        # Started outside the repository, so the copy is not shadowed by this tree.
        args = ["-m", "distributed.cli.dask_worker", cluster.address, "--name", "other"]
        with open(tmp_path / "dask" / "worker-other.log", "wb") as log:
            worker = subprocess.Popen([python, *args], stdout=log, stderr=log, cwd=tmp_path)
        cluster.workers.append(worker)
        from distributed import Client

        with Client(cluster.address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
        out = tmp_path / "out"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "dpsub_dist.cli",
                "estimate",
                str(data),
                "--rank",
                "1",
                "--epsilon",
                "1",
                "--delta",
                "1e-6",
                "--seed",
                "1",
                "--out",
                str(out),
                "--scheduler",
                cluster.address,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=tmp_path,
        )
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()
    ours = PYPROJECT["project"]["version"]
    assert "version mismatch" in line and f"dpsub_dist {ours}" in line
    assert f"dpsub_dist {other} on the worker" in line and "dask " not in line.split("found")[1]
    assert not out.exists()

"""Credentials and DP noise seeds never appear in outputs, logs, errors or task names.

A job reads Parquet from a real S3-compatible server (tests/s3server.py, IAM on) with
the credentials given as ``--storage-option``; DP noise comes from a seed we plant
(``privacy.noise.new_noise_seed`` patched to a distinctive 128-bit value). Everything
a person or a log collector could see is then grepped for the secret, the access key
id, the noise seed (decimal and hex) and the noise generator's internal state:

- the CLI's stdout and stderr, and the manifest;
- every log record of the driver process at DEBUG level (botocore, s3fs, distributed…);
- the workers' logs (``Client.get_worker_logs``);
- every task key the scheduler saw and the repr of its run spec (the dashboard shows
  key names; failed-task logs show the task's repr);
- the message of an error raised while using the credentials.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin
from s3server import S3Server, s3_server, upload

from dpsub_dist.cli import main
from dpsub_dist.privacy import noise

NOISE_SEED = 0x5EC2E7_D15C0_0DDBA11_C0FFEE_FACADE_1234
"""A planted private noise seed (≥ 2¹²⁶): distinctive in decimal and in hex."""


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def s3_dataset(tmp_path_factory, s3) -> str:
    from dpsub_dist.synth import generate

    local = tmp_path_factory.mktemp("synth") / "secretdata"
    generate(local, rows=8_000, dim=6, rank=2, partitions=2, seed=2)
    upload(s3, local, "s3://data/secretdata")
    return "s3://data/secretdata/"


class TaskRecorder(SchedulerPlugin):
    """Records every task key and run-spec repr the scheduler is given."""

    name = "test-secrets-task-recorder"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def update_graph(self, scheduler, *, keys, **kwargs) -> None:
        for key in keys:
            self.texts.append(str(key))
        for key, state in scheduler.tasks.items():
            self.texts += [str(key), state.prefix.name, *_spec_reprs(state.run_spec)]

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        self.texts.append(str(key))


def _spec_reprs(spec, depth: int = 0) -> list[str]:
    """repr of a task spec and, recursively, of its function, arguments and literal values."""
    texts = [repr(spec)]
    if depth > 4:
        return texts
    for name in ("func", "value"):
        if hasattr(spec, name):
            texts.append(repr(getattr(spec, name)))
    for arg in [*getattr(spec, "args", ()), *getattr(spec, "kwargs", {}).values()]:
        texts += _spec_reprs(arg, depth + 1)
    if isinstance(spec, tuple | list):
        for item in spec:
            texts += _spec_reprs(item, depth + 1)
    return texts


@pytest.fixture()
def task_recorder(dask_cluster):
    recorder = TaskRecorder()
    dask_cluster.scheduler.add_plugin(recorder, name=recorder.name)
    yield recorder
    dask_cluster.scheduler.remove_plugin(name=recorder.name)


class PlantedNoise:
    """Makes every DP noise generator start from NOISE_SEED and remembers its state."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.states: list[str] = []
        make = noise.noise_rng

        def planted_rng(private_seed: int | None = None) -> np.random.Generator:
            rng = make(NOISE_SEED if private_seed is None else private_seed)
            state = rng.bit_generator.state["state"]
            self.states += [str(state["state"]), str(state["inc"])]
            return rng

        monkeypatch.setattr(noise, "new_noise_seed", lambda: NOISE_SEED)
        monkeypatch.setattr(noise, "noise_rng", planted_rng)
        monkeypatch.setattr("dpsub_dist.context.noise_rng", planted_rng)  # its one caller

    def secrets(self) -> list[str]:
        return [str(NOISE_SEED), f"{NOISE_SEED:x}", f"{NOISE_SEED:X}", *self.states]


def _assert_absent(secrets: list[str], texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into {where}"


def test_credentials_and_noise_seed_never_visible(
    s3, s3_dataset, tmp_path: Path, scheduler_address, task_recorder, monkeypatch, capsys, caplog
) -> None:
    planted = PlantedNoise(monkeypatch)
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    code = main(
        ["estimate", s3_dataset, "--rank", "2", "--epsilon", "8", "--delta", "1e-6"]
        + ["--subsets", "200", "--seed", "4", "--out", str(out)]
        + ["--scheduler", scheduler_address, *s3.storage_args("reader")]
    )
    captured = capsys.readouterr()
    # t = 200 is above the friendly minimum at ε = 8 (95): a basis is released, so every
    # step drew its noise (radius search, core test, the Gaussian) before the checks below
    assert code == 0, captured.err
    assert planted.states, "the planted noise generator was not used"
    assert (out / "basis.npy").exists()
    manifest = (out / "manifest.json").read_text()
    steps = json.loads(manifest)["privacy"]["budget"]["steps"]
    assert [s["step"] for s in steps] == [
        "norm_bound",
        "mean",
        "radius_search",
        "core_test",
        "core_noise",
        "variance_norm_bound",
        "explained_variance",
    ]
    assert json.loads(manifest)["release"]["noise_sigma"] > 0  # the Gaussian was drawn
    with Client(scheduler_address) as client:
        worker_logs = [m for records in client.get_worker_logs().values() for _, m in records]
    assert task_recorder.texts, "the scheduler plugin saw no tasks"
    creds = s3.users["reader"]
    texts = {
        "stdout": captured.out,
        "stderr": captured.err,
        "manifest": manifest,
        "driver logs": "\n".join(r.getMessage() for r in caplog.records),
        "worker logs": "\n".join(worker_logs),
        "task keys and specs": "\n".join(task_recorder.texts),
    }
    _assert_absent([creds.secret, *planted.secrets()], texts)
    # the access key id is not secret to AWS's own debug logs, but never in ours
    del texts["driver logs"]
    _assert_absent([creds.key], texts)


def test_credentials_not_in_error_messages(
    s3, s3_dataset, tmp_path: Path, scheduler_address, capsys
) -> None:
    """A refused credential is named as the problem without being printed."""
    wrong_secret = "Wr0ngSecretThatMustNotPrint" + "x" * 13
    storage = ["--storage-option", f"endpoint_url={s3.endpoint}"]
    storage += ["--storage-option", f"key={s3.users['reader'].key}"]
    storage += ["--storage-option", f"secret={wrong_secret}"]
    code = main(
        ["estimate", s3_dataset, "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
        + ["--out", str(tmp_path / "out"), "--quiet", "--scheduler", scheduler_address, *storage]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "credentials" in err
    assert wrong_secret not in err and s3.users["reader"].key not in err
    assert not (tmp_path / "out").exists()

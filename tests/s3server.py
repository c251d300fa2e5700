"""A real S3-compatible server for tests: moto's server mode in its own process on
127.0.0.1 (a free port), with IAM authentication switched on, as s3fs's own tests do.

Users (each with an access key; every other key is rejected once auth is on):

- ``admin``: ``s3:*`` on everything;
- ``reader``: list and get objects, nothing else (writes are denied);
- ``driver``: list every bucket, and get/put/delete only under ``<bucket>/runs/``: it can
  plan a job and write its outputs but cannot open a data file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGION = "us-east-1"


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Credentials:
    key: str
    secret: str = field(repr=False)


MOTO_OPERATIONS = {
    "s3:ListBucket": ["s3:ListObjectsV2", "s3:ListObjects", "s3:HeadBucket"],
    "s3:ListAllMyBuckets": ["s3:ListBuckets"],
    "s3:GetObject": ["s3:HeadObject"],
    "s3:PutObject": [
        "s3:CreateMultipartUpload",
        "s3:UploadPart",
        "s3:CompleteMultipartUpload",
        "s3:AbortMultipartUpload",
    ],
    "s3:DeleteObject": ["s3:DeleteObjects"],
}
"""The API operations each IAM action covers, as moto >= 5.2.6 names them. AWS checks a
request against the IAM action (ListObjectsV2 needs ``s3:ListBucket``); moto 5.2.6 checks it
against ``s3:`` + the operation's name instead, so a real policy's ``s3:ListBucket`` no
longer lets a user list. Each policy grants both names of what it allows, and nothing more,
so the users hold the same rights on every moto 5 (and on real S3)."""


def _policy(*statements: tuple[list[str], list[str]]) -> str:
    """An IAM policy of Allow statements (actions, resources), each action with the
    operation names moto checks (:data:`MOTO_OPERATIONS`)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": [*actions, *(o for a in actions for o in MOTO_OPERATIONS.get(a, []))],
                    "Resource": resources,
                }
                for actions, resources in statements
            ],
        }
    )


POLICIES = {
    "admin": _policy((["s3:*"], ["*"])),
    "reader": _policy((["s3:ListBucket", "s3:GetObject", "s3:ListAllMyBuckets"], ["*"])),
    "driver": _policy(
        (["s3:ListBucket", "s3:ListAllMyBuckets"], ["*"]),
        (["s3:GetObject", "s3:PutObject", "s3:DeleteObject"], ["arn:aws:s3:::*/runs/*"]),
    ),
}


@dataclass
class S3Server:
    """A running moto server: its endpoint and the users' credentials."""

    endpoint: str
    process: subprocess.Popen
    users: dict[str, Credentials]
    log: Path

    def storage_options(self, user: str = "admin") -> dict[str, Any]:
        creds = self.users[user]
        return {"endpoint_url": self.endpoint, "key": creds.key, "secret": creds.secret}

    def storage_args(self, user: str = "admin") -> list[str]:
        """``--storage-option`` arguments carrying the endpoint and ``user``'s credentials."""
        args: list[str] = []
        for name, value in self.storage_options(user).items():
            args += ["--storage-option", f"{name}={value}"]
        return args

    def env(self, user: str | None = "admin") -> dict[str, str]:
        """os.environ with the endpoint and ``user``'s credentials (None: no credentials)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_DEFAULT_REGION=REGION)
        if user is not None:
            creds = self.users[user]
            env.update(AWS_ACCESS_KEY_ID=creds.key, AWS_SECRET_ACCESS_KEY=creds.secret)
        return env

    def fs(self, user: str = "admin"):
        """A fresh s3fs filesystem as ``user``."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options(user))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/octet-stream"}
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def _wait_until_up(endpoint: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2):
                return
        time.sleep(0.1)
    raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}")


def start_s3_server(workdir: Path, authenticate: bool = True) -> S3Server:
    """Start moto on a free loopback port; create the users, then enforce authentication."""
    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = workdir / f"moto-{port}.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        )
    try:
        _wait_until_up(endpoint, process, log)
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        users = {}
        for name, policy in POLICIES.items():
            iam.create_user(UserName=name)
            iam.put_user_policy(UserName=name, PolicyName=f"{name}-s3", PolicyDocument=policy)
            key = iam.create_access_key(UserName=name)["AccessKey"]
            users[name] = Credentials(key["AccessKeyId"], key["SecretAccessKey"])
        if authenticate:
            _post(f"{endpoint}/moto-api/reset-auth", b"0")
    except BaseException:
        process.kill()
        process.wait()
        raise
    return S3Server(endpoint, process, users, log)


@contextlib.contextmanager
def s3_server(workdir: Path, authenticate: bool = True) -> Iterator[S3Server]:
    """A moto server for the duration of the block."""
    server = start_s3_server(workdir, authenticate)
    try:
        yield server
    finally:
        server.stop()


def upload(server: S3Server, local: Path, url: str, user: str = "admin") -> None:
    """Copy a local folder (recursively) to ``s3://bucket/prefix``, creating the bucket."""
    fs = server.fs(user)
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    fs.put(str(local), url.removeprefix("s3://").rstrip("/"), recursive=True)

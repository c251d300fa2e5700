"""docs/object-storage.md's walkthrough works as written.

The ```bash blocks between the walkthrough markers run in order in a fresh folder, with the
project's virtualenv first on PATH: the first block (the S3-compatible server) in the
background, the rest as one bash script (so ``export`` carries over). The only change is
the server's port: 5000 in the text, a free port here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from s3server import free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "object-storage.md"
DOC_PORT = "5000"


def walkthrough_blocks() -> list[str]:
    text = DOC.read_text()
    section = text.split("<!-- walkthrough:start -->")[1].split("<!-- walkthrough:end -->")[0]
    return re.findall(r"^```bash\n(.*?)^```$", section, re.S | re.M)


def test_walkthrough_runs_as_written(tmp_path):
    server_block, *steps = walkthrough_blocks()
    assert "moto.server" in server_block and len(steps) >= 4
    port = str(free_port())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    server = subprocess.Popen(
        ["bash", "-c", f"exec {server_block.replace(DOC_PORT, port).strip()}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no server"
                time.sleep(0.2)
        script = "set -euo pipefail\n" + "\n".join(steps).replace(f":{DOC_PORT}", f":{port}")
        run = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert run.returncode == 0, run.stderr[-3000:]
    (error,) = re.findall(r"^subspace_error=([0-9.]+)$", run.stdout, re.M)
    assert float(error) <= 0.1
    listed = [line for line in run.stdout.splitlines() if line.startswith("dpsub-demo/runs/")]
    assert listed == ["dpsub-demo/runs/run-001/basis.npy", "dpsub-demo/runs/run-001/manifest.json"]

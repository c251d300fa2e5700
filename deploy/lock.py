"""Print the pinned runtime requirements of dpsub_dist (the container image's lock file).

Walks the *installed* distributions from ``dpsub_dist``'s runtime dependencies (no dev
extras), following extras such as ``dask[distributed,dataframe]`` and environment
markers for Linux / this Python, and prints ``name==version`` for each, sorted:

    .venv/bin/python deploy/lock.py > deploy/requirements.lock
    .venv/bin/python deploy/lock.py postgres dashboard > deploy/requirements.lock   # the image's

(the extras must be installed in the virtualenv: ``pip install -e '.[dev,dashboard]'``).
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = "dpsub_dist"
TARGET = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}


def _environment(extra: str) -> dict[str, str]:
    return {
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "python_full_version": platform.python_version(),
        "implementation_name": sys.implementation.name,
        "platform_python_implementation": platform.python_implementation(),
        "platform_machine": "x86_64",
        **TARGET,
        "extra": extra,
    }


def _wanted(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate(_environment(e)) for e in (extras or {""}))


def runtime_closure(root: str = ROOT, extras: tuple[str, ...] = ()) -> dict[str, str]:
    """{canonical name: installed version} of everything ``root[extras]`` needs at run time."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset(extras))]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = metadata.distribution(name)
        if name != root:
            pins[canonicalize_name(name)] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if _wanted(requirement, set(extras)):
                todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return pins


def main() -> None:
    extras = tuple(sys.argv[1:])
    command = " ".join(["deploy/lock.py", *extras])
    print(f"# runtime lock for {ROOT}: .venv/bin/python {command} > deploy/requirements.lock")
    for name, version in sorted(runtime_closure(ROOT, extras).items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()

"""Private PCA peers side by side with dpsub, in memory: IBM diffprivlib and OpenDP.

Each peer runs in its own virtual environment under ``bench/.venvs/<name>`` that this
command creates on first use (``pip install`` of the pinned specs below; diffprivlib needs
scikit-learn < 1.6), in a subprocess with a time limit and an address-space limit, so a
peer that runs out of time or memory is reported as ``timeout`` / ``out_of_memory``
instead of stopping the bench. ``sklearn`` (non-private PCA, the project's environment) is
the reference for the error a non-private method reaches on the same rows.

Both peers are pure ε-DP and need a public bound on the row norm; they get
``3·sqrt(k + γ²(D − k))`` for the Gaussian model (rows are clipped to it). dpsub runs with
(ε, δ) = (``--epsilon``, ``--delta``) on the same in-memory rows (``array_dataset``).

Example (the published run):
``python -m bench.peers --rows 20000 --dims 5,10,20,50 --time-limit 120``.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import common

VENV_DIR = common.ROOT / "bench" / ".venvs"
WORKER = Path(__file__).with_name("peer_worker.py")
PEER_SPECS: dict[str, list[str]] = {
    "diffprivlib": ["diffprivlib==0.6.6", "scikit-learn>=1.4,<1.6"],
    "opendp": ["opendp[scikit-learn]==0.16.0"],
}
"""Pinned installs of each peer's environment (scikit-learn < 1.6 for diffprivlib)."""
REFERENCE = "sklearn"


def public_norm_bound(params: dict[str, Any]) -> float:
    """The row-norm bound the peers are given: 3 × the typical row norm of the model."""
    k, d, gamma = params["rank"], params["dim"], params["gamma"]
    if params.get("model", "gaussian") == "gaussian":
        return 3.0 * math.sqrt(k + gamma**2 * (d - k))
    return 3.0 * math.sqrt(1.0 + gamma**2 * d)


def method_config(method: str, norm: float) -> dict[str, Any]:
    """Extra EstimateConfig fields a dpsub method needs: the covariance family's row bound."""
    return {"row_norm": norm} if method in ("gauss", "gap-perturb") else {}


def peer_python(name: str, venv_dir: Path = VENV_DIR, install: bool = True) -> str | None:
    """Interpreter of the peer's venv, creating it on first use; None if unavailable."""
    if name == REFERENCE:
        return sys.executable
    venv = Path(venv_dir) / name
    python = venv / "bin" / "python"
    marker = venv / ".installed.json"
    specs = PEER_SPECS[name]
    if marker.exists() and json.loads(marker.read_text()) == specs:
        return str(python)
    if not install:
        return None
    common.log(f"creating {venv} and installing {' '.join(specs)}")
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *specs],
            check=True,
            timeout=1800,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        common.log(f"could not set up {name}: {err}")
        return None
    marker.write_text(json.dumps(specs))
    return str(python)


def rows_npy(path: Path) -> Path:
    """The dataset's rows as one float32 .npy beside it (written once, column by column)."""
    import pyarrow.parquet as pq

    out = Path(path) / "_bench" / "rows.npy"
    if out.exists():
        return out
    out.parent.mkdir(exist_ok=True)
    files = sorted(Path(path).glob("*.parquet"))
    metas = [pq.ParquetFile(f).metadata for f in files]
    n, d = sum(m.num_rows for m in metas), metas[0].num_columns
    tmp = out.with_suffix(".tmp.npy")
    array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, d))
    start = 0
    for file, meta in zip(files, metas, strict=True):
        table = pq.read_table(file)
        for j, column in enumerate(table.columns):
            array[start : start + meta.num_rows, j] = column.to_numpy()
        start += meta.num_rows
    array.flush()
    del array
    tmp.replace(out)
    return out


def _limit_memory(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


def run_peer(
    name: str,
    data: Path,
    truth: np.ndarray,
    *,
    epsilon: float,
    norm: float,
    time_limit: float,
    memory_limit_gib: float,
    venv_dir: Path = VENV_DIR,
    install: bool = True,
    bounds: tuple[float, float] | Path | None = None,
    keep_basis: bool = False,
) -> dict[str, Any]:
    """One fit of a peer in its venv; status ok / timeout / out_of_memory / error / unavailable.

    ``bounds``: public (lower, upper) bounds of every feature, or a 2 × D ``.npy`` of
    per-feature bounds; diffprivlib then centres with its own private mean
    (``centered=False``) instead of assuming centred data. ``keep_basis``:
    also return the orthonormalised basis (key ``basis``)."""
    from dpsub_dist.linalg import subspace_error

    python = peer_python(name, venv_dir, install)
    if python is None:
        return {"status": "unavailable", "message": f"no environment for {name}"}
    out = Path(data).with_name(f"basis-{name}-{os.getpid()}.npy")
    cmd = [python, str(WORKER), name, str(data), str(out)]
    cmd += ["--rank", str(truth.shape[1]), "--epsilon", str(epsilon), "--norm", str(norm)]
    if isinstance(bounds, Path):
        cmd += ["--bounds", str(bounds)]
    elif bounds:
        cmd += ["--bounds", f"{bounds[0]!r},{bounds[1]!r}"]
    threads = str(len(os.sched_getaffinity(0)))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads}
    started = time.monotonic()
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=time_limit,
            env=env,
            preexec_fn=_limit_memory(int(memory_limit_gib * 2**30)),
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": time.monotonic() - started, "limit_s": time_limit}
    wall = time.monotonic() - started
    if done.returncode != 0:
        text = [line for line in done.stderr.splitlines() if "Error" in line]
        last = text[-1].strip() if text else f"exit code {done.returncode}"
        oom = "MemoryError" in done.stderr or "Unable to allocate" in done.stderr
        status = "out_of_memory" if oom else "error"
        return {"status": status, "wall_s": wall, "message": last[-300:]}
    report = next(
        json.loads(line.split(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith("PEER_REPORT ")
    )
    basis = np.load(out)
    out.unlink()
    basis, _ = np.linalg.qr(basis)
    return {
        "status": "ok",
        "wall_s": wall,
        "fit_s": report["fit_s"],
        "error": subspace_error(basis, truth),
        "peer_versions": report["versions"],
        **({"basis": basis} if keep_basis else {}),
    }


def run_private_tools(
    path: Path,
    truth: np.ndarray,
    params: dict[str, Any],
    methods: list[str],
    peers: list[str],
    args: Any,
    seed: int,
    in_memory: bool,
    failures: dict[str, tuple[int, int, str]] | None = None,
) -> list[dict[str, Any]]:
    """dpsub methods and peers on one dataset: one record per tool (error, time, status).

    ``failures`` remembers, per peer, the (n, D) where it ran out of time or memory; it is
    then not started on data at least as large (recorded as ``skipped_after_<status>``).
    """
    failures = {} if failures is None else failures
    n, d = params["rows"], params["dim"]
    records = []
    if methods:
        if in_memory:
            rows = common.load_rows(path)
            opener = common.array_opener(rows)
        else:
            rows, opener = None, common.parquet_opener(path)
        for method in methods:
            record = common.run_dpsub(
                method,
                opener,
                rank=truth.shape[1],
                epsilon=args.epsilon,
                delta=args.delta,
                seed=seed,
                truth=truth,
                **method_config(method, public_norm_bound(params)),
            )
            record["fit_s"] = record["wall_s"]
            records.append({"tool": f"dpsub {method}", **common.drop_arrays(record)})
        del rows, opener
    if peers:
        data = rows_npy(path)
        for name in peers:
            if name in failures and n >= failures[name][0] and d >= failures[name][1]:
                fn, fd, status = failures[name]
                records.append(
                    {
                        "tool": name,
                        "status": f"skipped_after_{status}",
                        "message": f"{status} at n={fn}, D={fd}",
                    }
                )
                continue
            record = run_peer(
                name,
                data,
                truth,
                epsilon=args.epsilon,
                norm=public_norm_bound(params),
                time_limit=args.time_limit,
                memory_limit_gib=args.memory_limit_gib,
                venv_dir=args.venv_dir,
                install=not args.no_install,
            )
            records.append({"tool": name, **record})
            if record["status"] in ("timeout", "out_of_memory"):
                failures[name] = (n, d, record["status"])
    for record in records:
        record.update(rows=params["rows"], dim=params["dim"], seed=seed)
        common.log(
            f"n={params['rows']} d={params['dim']} seed={seed} {record['tool']:>18}: "
            f"{record['status']} error={record.get('error', float('nan')):.3g} "
            f"t={record.get('wall_s', float('nan')):.2f}s"
        )
    return records


def add_peer_arguments(parser: Any, default_peers: str) -> None:
    """Options shared by the commands that run peers."""
    parser.add_argument(
        "--peers",
        type=common.str_list,
        default=common.str_list(default_peers),
        help=f"comma-separated: {','.join([*PEER_SPECS, REFERENCE])} ('' for none)",
    )
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per peer fit")
    parser.add_argument("--memory-limit-gib", type=float, default=5.0, help="per peer process")
    parser.add_argument("--venv-dir", type=Path, default=VENV_DIR)
    parser.add_argument("--no-install", action="store_true", help="report missing envs instead")


def check_peers(parser: Any, peers: list[str]) -> None:
    unknown = set(peers) - {*PEER_SPECS, REFERENCE}
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}: use {','.join([*PEER_SPECS, REFERENCE])}")


def dataset_for(args: Any, rows: int, dim: int, seed: int) -> tuple[Path, np.ndarray, dict]:
    """The Gaussian-gap dataset of the utility benches: γ = gamma_dim / D."""
    gamma = args.gamma_dim / dim
    path, truth = common.dataset(
        args.data_dir, rows=rows, dim=dim, rank=args.rank, gamma=gamma, seed=seed
    )
    params = {"rows": rows, "dim": dim, "rank": args.rank, "gamma": gamma, "model": "gaussian"}
    return path, truth, params


def summarise(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per (tool, key): error median / p90 (⊥ and failures count as error 1), rates, times."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["tool"], r[key]), []).append(r)
    table = []
    for (tool, value), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        statuses = [r["status"] for r in runs]
        errors = [r.get("error", 1.0) if r["status"] in ("ok", "bottom") else 1.0 for r in runs]
        finished = [r["fit_s"] for r in runs if r["status"] in ("ok", "bottom") and "fit_s" in r]
        table.append(
            {
                "tool": tool,
                key: value,
                "runs": len(runs),
                "error": common.quantiles(errors),
                "bottom_rate": statuses.count("bottom") / len(runs),
                "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
                "median_fit_s": common.median(finished),
            }
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("peers", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=common.int_list, default=[20_000])
    parser.add_argument("--dims", type=common.int_list, default=[10, 100, 1000, 10_000])
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=1.0, help="γ = gamma_dim / D")
    parser.add_argument(
        "--methods", type=common.str_list, default=["friendly", "histogram", "gauss"]
    )
    parser.add_argument("--seed", type=int, default=1)
    add_peer_arguments(parser, "diffprivlib,opendp,sklearn")
    args = common.parse_args(parser, argv)
    check_peers(parser, args.peers)
    run = common.BenchRun.start("peers", args)
    methods = common.available_methods(args.methods)
    records: list[dict[str, Any]] = []
    failures: dict[str, tuple[int, int, str]] = {}
    if run.replayed:
        records = run.replayed["records"]
    else:
        for n in args.rows:
            for d in args.dims:
                path, truth, params = dataset_for(args, n, d, args.seed)
                records += run_private_tools(
                    path, truth, params, methods, args.peers, args, args.seed, True, failures
                )
    table = summarise(records, "dim")
    for row in table:
        row["rows"] = args.rows
    plots = [] if args.no_plot else plot(run, records, args)
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "gamma": "gamma_dim / D",
        "gamma_dim": args.gamma_dim,
        "methods": methods,
        "peers": args.peers,
        "time_limit_s": args.time_limit,
        "memory_limit_gib": args.memory_limit_gib,
        "epsilon": args.epsilon,
        "delta_dpsub": args.delta,
        "delta_peers": 0.0,
        "peer_specs": PEER_SPECS,
        "norm_bound": "3 * sqrt(k + gamma^2 (D - k))",
    }
    run.write(parameters, records, table, plots)
    return 0


def plot(run: common.BenchRun, records: list[dict[str, Any]], args: Any) -> list[Path]:
    fig, (err_ax, time_ax) = common.figure(
        run,
        f"n={args.rows}, rank={args.rank}, gamma={args.gamma_dim}/D, eps={args.epsilon} "
        f"(dpsub delta={args.delta}; peers pure eps), seed {args.seed}, in memory; "
        f"peer limit {args.time_limit:.0f}s / {args.memory_limit_gib} GiB",
        ncols=2,
    )
    tools = sorted({r["tool"] for r in records})
    for tool in tools:
        ok = [r for r in records if r["tool"] == tool and r["status"] in ("ok", "bottom")]
        if ok:
            xs = [r["dim"] for r in ok]
            err_ax.plot(xs, [r.get("error", 1.0) for r in ok], "o-", label=tool)
            time_ax.plot(xs, [r["fit_s"] for r in ok], "o-", label=tool)
        for r in records:
            if r["tool"] == tool and r["status"] not in ("ok", "bottom"):
                time_ax.annotate(r["status"], (r["dim"], args.time_limit), fontsize=6, rotation=20)
    for ax, label in ((err_ax, "subspace error ||P_hat - P|| (⊥ = 1)"), (time_ax, "fit time, s")):
        ax.set_xscale("log")
        ax.set_xlabel("D")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    time_ax.axhline(args.time_limit, color="grey", ls=":", label="time limit")
    time_ax.set_yscale("log")
    err_ax.set_title("error, same rows, in memory")
    time_ax.set_title("fit time (data already loaded)")
    return [common.save(fig, run)]


if __name__ == "__main__":
    raise SystemExit(main())

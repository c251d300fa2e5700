"""Markdown tables from bench JSON files (the tables of docs/benchmarks.md are its output).

``python -m bench.report docs/bench-data`` prints one section per JSON found: the command,
the machine and versions, then the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def header(doc: dict[str, Any]) -> list[str]:
    m, v = doc["machine"], doc["versions"]
    versions = ", ".join(f"{k} {v[k]}" for k in sorted(v))
    return [
        f"Command: `{doc['command']}`  ",
        f"Machine: {m['nproc']} cores, {m['memory_gib']} GiB, {m['cpu']}, load average at start "
        f"{m['load_average_at_start']} ({m['shared']}); started {doc['started']}, "
        f"took {doc['wall_s']:.0f} s  ",
        f"Versions: {versions}",
        "",
    ]


def speed_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| n | D | tool | median wall s | rows/s/core | peak worker RSS MiB | error |",
        "|---|---|---|---|---|---|---|",
    ]
    ratio_lines = ["", "| n | D | ratio | of medians | median of paired |", "|---|---|---|---|---|"]
    for row in doc["summary"]["table"]:
        for tool, t in row["tools"].items():
            lines.append(
                f"| {row['rows']:.0e} | {row['dim']} | {tool} | {_fmt(t['median_wall_s'])} | "
                f"{t['rows_per_s_per_core']:.3g} | {_fmt(t['median_peak_worker_rss_mib'], 4)} | "
                f"{_fmt(t['median_error'], 2)} |"
            )
        for name, value in row["ratios"].items():
            paired_key = name.replace("_fraction_of_floor_throughput", "_over_floor")
            paired = row["paired_ratios"].get(paired_key)
            if "floor" in name and paired:
                paired = 1 / paired
            ratio_lines.append(
                f"| {row['rows']:.0e} | {row['dim']} | {name} | {_fmt(value)} | {_fmt(paired)} |"
            )
        for tool, message in row.get("not_run", []):
            ratio_lines.append(
                f"| {row['rows']:.0e} | {row['dim']} | {tool} not run | {message} | |"
            )
    return lines + ratio_lines


def quantile_table(doc: dict[str, Any], key: str) -> list[str]:
    lines = [
        f"| {key} | tool | runs | error median | error p90 | ⊥ rate | statuses | median fit s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(doc["summary"], key=lambda r: (r[key], r["tool"])):
        statuses = ", ".join(f"{s} {c}" for s, c in row["statuses"].items())
        lines.append(
            f"| {row[key]} | {row['tool']} | {row['runs']} | {_fmt(row['error']['median'])} | "
            f"{_fmt(row['error']['p90'])} | {row['bottom_rate']:.2f} | {statuses} | "
            f"{_fmt(row['median_fit_s'])} |"
        )
    return lines


def records_table(doc: dict[str, Any], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in doc["records"]:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return lines


def section(path: Path) -> list[str]:
    doc = json.loads(path.read_text())
    name = doc["bench"]
    lines = [f"### {path.stem}", "", *header(doc)]
    if name == "speed":
        lines += speed_table(doc)
    elif name in ("utility_dim", "peers", "mean_estimation"):
        lines += quantile_table(doc, "dim")
    elif name == "utility_n":
        lines += quantile_table(doc, "rows")
    elif name == "memory":
        lines += records_table(
            doc, ["rows", "tool", "status", "wall_s", "peak_worker_rss_mib", "bytes_gathered"]
        )
    elif name == "beyond_memory":
        columns = ["attempt", "exit_code", "wall_s", "peak_rss_mib", "killed", "output"]
        lines += records_table(doc, [*columns, "method", "bytes_gathered", "error"])
    elif name == "generated_rows":
        columns = ["rows", "dim", "wall_s", "rows_per_s", "peak_worker_rss_mib"]
        lines += records_table(doc, [*columns, "method", "bytes_gathered", "error"])
    elif name == "wide":
        lines += records_table(
            doc,
            ["rows", "dim", "status", "wall_s", "error", "peak_worker_rss_mib", "shuffle_gib"],
        )
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["docs/bench-data"])[0])
    for path in sorted(folder.glob("*.json")):
        print("\n".join(section(path)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

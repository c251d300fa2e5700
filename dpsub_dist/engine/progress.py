"""Progress of long runs on stderr: a live bar on a terminal, plain periodic lines in a log.

On a TTY the bar is drawn by ``rich.progress`` (redrawn in place). Anywhere else (a file,
a pipe, a scheduler's log) nothing is redrawn: one plain line is written when a pass
starts, then at most one every :data:`LOG_INTERVAL_S` seconds or :data:`LOG_STEP` of the
work, and one at the end, each ``label: done/total tasks (pct%), elapsed, rows/s, ETA``,
so a log carries at most ≈ 12 lines per pass however long the run. Within
:func:`numbered_passes` (one run) each pass is labelled ``pass i: …``, and
:func:`closing_line` sums the run up.

What it shows is a function of the task count and the wall clock, which follow the row
count: callers draw it only where n is public (row level, ``job.progress_shown``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any

LOG_INTERVAL_S = 10.0
"""Seconds between two plain lines in a non-interactive log (unless :data:`LOG_STEP` passed)."""

LOG_STEP = 0.1
"""Share of the work between two plain lines even when they come faster than the interval."""


@dataclass
class RunPasses:
    """The passes of one run so far, and its row count where public (for every pass's
    rows/s: each reads the table once)."""

    count: int = 0
    rows: int | None = None


_PASSES: ContextVar[RunPasses | None] = ContextVar("dpsub_passes", default=None)


@contextlib.contextmanager
def numbered_passes() -> Iterator[RunPasses]:
    """Label every :class:`Progress` drawn in the block ``pass 1: …``, ``pass 2: …`` (one
    run); set ``rows`` on the object it yields once n is known and public (row level)."""
    token = _PASSES.set(RunPasses())
    try:
        yield _PASSES.get()
    finally:
        _PASSES.reset(token)


def closing_line(manifest: Mapping[str, Any]) -> str:
    """``done: N rows, spent epsilon=…, delta=…``: published values only.

    The budget spent is published; n only at row level (at user level the row count is
    private and left out). No run time: like the step timings the manifest withholds, it
    depends on the data (its rank and spread, not only n), and this line stays in the logs
    a scheduler forwards.
    """
    spent = manifest["privacy"]["budget"]["spent"]
    budget = ", ".join(
        f"{k}={spent[k]:.6g}" for k in ("epsilon", "rho", "delta", "delta0") if k in spent
    )
    rows = ""
    if manifest["privacy"].get("unit") == "row" and manifest.get("n_rows") is not None:
        rows = f": {int(manifest['n_rows']):,} rows"
    return f"done{rows}, spent {budget}"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Tasks done of ``total`` for one step; ``rows`` (public n) adds an estimated rows/s.

    Use as a context manager, calling :meth:`update` with the number of tasks done.
    """

    def __init__(
        self,
        total: int,
        label: str,
        rows: int | None = None,
        stream: IO[str] | None = None,
        interactive: bool | None = None,
    ) -> None:
        run = _PASSES.get()
        if run is not None:
            run.count += 1
            label = f"pass {run.count}: {label}"
            rows = run.rows if rows is None else rows
        self.total, self.label, self.rows = max(int(total), 1), label, rows
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.interactive = isatty() if interactive is None else interactive
        self.started = time.monotonic()
        self._last_time, self._last_done, self.done = self.started, 0, 0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.interactive:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[rate]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, rate="")
        else:
            self._line()
        return self

    def update(self, done: int) -> None:
        """Record ``done`` tasks finished; redraw the bar or write a line when one is due."""
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done, rate=self._rate())
            return
        now = time.monotonic()
        step_due = (done - self._last_done) >= LOG_STEP * self.total
        if done >= self.total or now - self._last_time >= LOG_INTERVAL_S or step_due:
            if done > self._last_done:
                self._line()
                self._last_time, self._last_done = now, done

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _line(self) -> None:
        elapsed = time.monotonic() - self.started
        share = self.done / self.total
        parts = [f"{self.label}: {self.done}/{self.total} tasks ({100 * share:.0f}%)"]
        parts.append(f"elapsed {_clock(elapsed)}")
        if self.done and elapsed > 0:
            if self.rows is not None:
                parts.append(self._rate())
            parts.append(f"ETA {_clock(elapsed * (1 - share) / share)}")
        self.stream.write(", ".join(parts) + "\n")
        self.stream.flush()

    def _rate(self) -> str:
        """``≈N rows/s`` of this pass so far (its share of the tasks done over its time)."""
        elapsed = time.monotonic() - self.started
        if self.rows is None or not self.done or elapsed <= 0:
            return ""
        return f"≈{self.rows * self.done / self.total / elapsed:,.0f} rows/s"


def progress_bar(done: int, total: int, started: float, label: str) -> None:
    """One plain line (never ``\\r``): ``label: done/total, elapsed`` — for callers that
    step their own loop (each call is one line, so call it sparingly)."""
    elapsed = _clock(time.monotonic() - started)
    sys.stderr.write(f"{label}: {done}/{total}, elapsed {elapsed}\n")
    sys.stderr.flush()

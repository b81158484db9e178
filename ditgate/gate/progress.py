"""Calibration progress: sites done of total, forms timed, time spent — a bar on a terminal, log lines otherwise.

Calibration runs inside the user's first forward and can take long on a big model; a user who sees nothing for a
minute assumes a hang. On a terminal a rich progress bar (on stderr, so the program's output is untouched) shows
it; elsewhere (a server's logs, a notebook, CI) a line goes to the ``ditgate.gate`` logger at INFO every
``LOG_EVERY_S`` seconds and when calibration ends.
"""

from __future__ import annotations

import logging
import sys
import time

from .book import TimingBook
from .verdict import Verdict

logger = logging.getLogger("ditgate.gate")

LOG_EVERY_S = 5.0


def _on_terminal() -> bool:
    return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


class CalibrationProgress:
    """One denoiser's calibration. ``total`` is the sites known before the first call (a module's later attention
    calls become sites as they happen, and raise it); ``bar``: None picks a bar on a terminal only."""

    def __init__(self, label: str, total: int, book: TimingBook, bar: bool | None = None) -> None:
        self.label = label or "model"
        self.total = total
        self.book = book
        self.sites: set[str] = set()
        self.started = time.perf_counter()
        self._timed_before = book.timed
        self._last_log = self.started
        self._bar = None
        if bar if bar is not None else _on_terminal():
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("ditgate: calibrating {task.description}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("sites, {task.fields[forms]} timings,"),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task(self.label, total=self.total, forms=0)
        self._bar.start()

    @property
    def timed(self) -> int:
        return self.book.timed - self._timed_before

    def text(self) -> str:
        return (f"ditgate: calibrating {self.label}: {len(self.sites)}/{max(self.total, len(self.sites))} sites, "
                f"{self.timed} timings, {self.book.cache_hits} from the cache, "
                f"{time.perf_counter() - self.started:.1f} s")

    def site_done(self, verdict: Verdict) -> None:
        self.sites.add(verdict.site)
        self.total = max(self.total, len(self.sites))
        if self._bar is not None:
            self._bar.update(self._task, completed=len(self.sites), total=self.total, forms=self.timed)
            return
        now = time.perf_counter()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            logger.info(self.text())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        logger.info(self.text() + " (done)")

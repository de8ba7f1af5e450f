"""What a person watching a worker start sees: one log line per stage with its time, and
progress bars (tqdm) only where stderr is a terminal.

A worker's stderr is the router's (spawned workers inherit it), so under `make serve` in a
terminal the bars show, and in CI logs, files and pipes they stay off: there the stage lines
say the same once each stage ends, with no carriage returns."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def show_progress() -> bool:
    """Whether progress bars go to stderr: only when it is a terminal."""
    return sys.stderr.isatty()


def progress(items: Iterable[T], desc: str, unit: str, total: int | None = None) -> tqdm:
    """`items` wrapped in a bar on stderr (rate and ETA), silent when stderr is not a tty."""
    return tqdm(items, desc=desc, unit=unit, total=total, file=sys.stderr,
                disable=not show_progress(), dynamic_ncols=True)


class Stages:
    """Logs `what in X.X s (detail)` as each stage ends, timed from the previous one."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.last = time.perf_counter()

    def done(self, what: str, detail: str = "") -> None:
        now = time.perf_counter()
        self.logger.info("%s in %.1f s%s", what, now - self.last, f" ({detail})" if detail else "")
        self.last = now

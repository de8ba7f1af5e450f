"""What a person watching a worker start sees: one log line per stage with its time, and
progress bars (tqdm) only where stderr is a terminal.

A worker's stderr is the router's (spawned workers inherit it), so under `make serve` in a
terminal the bars show, and in CI logs, files and pipes they stay off: there the stage lines
say the same once each stage ends, with no carriage returns."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
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


def run_counting(work: Callable[[], None], outputs: Sequence[Path], desc: str,
                 logger: logging.Logger) -> None:
    """Runs `work`, which writes the files `outputs` (one ninja run compiling modules, say),
    and says so first when any is missing; on a terminal a bar counts the files as they
    appear (rate and ETA), the work running on a thread. `work`'s exception is raised here."""
    missing = [p for p in outputs if not p.exists()]
    if not missing:
        return work()
    logger.info("%s: %d to build (the first run only; minutes)", desc, len(missing))
    if not show_progress():
        return work()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with tqdm(total=len(missing), desc=desc, unit="module", file=sys.stderr) as bar:
        while thread.is_alive():
            thread.join(0.5)
            bar.update(sum(p.exists() for p in missing) - bar.n)
    if errors:
        raise errors[0]

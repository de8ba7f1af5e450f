"""startup.run_counting: the JIT build's counter (work on a thread, a bar on a terminal)."""

import io
import logging
import time
from pathlib import Path

import pytest
from minisgl_worker import startup

LOG = logging.getLogger("test")


def writer(paths: list[Path], fail: bool = False):
    def work() -> None:
        for p in paths:
            time.sleep(0.3)
            p.write_text("built")
        if fail:
            raise RuntimeError("ninja failed")
    return work


def test_on_a_terminal_a_bar_counts_the_outputs(tmp_path: Path, monkeypatch) -> None:
    paths = [tmp_path / f"m{i}.so" for i in range(3)]
    err = io.StringIO()
    monkeypatch.setattr(startup, "show_progress", lambda: True)
    monkeypatch.setattr(startup.sys, "stderr", err)
    startup.run_counting(writer(paths), paths, "compiling", LOG)
    assert all(p.exists() for p in paths)
    assert "compiling: 100%" in err.getvalue() and "3/3" in err.getvalue(), err.getvalue()


def test_errors_reach_the_caller_and_pipes_get_no_bar(tmp_path: Path, monkeypatch) -> None:
    paths = [tmp_path / "m.so"]
    with pytest.raises(RuntimeError, match="ninja failed"):
        monkeypatch.setattr(startup, "show_progress", lambda: True)
        startup.run_counting(writer(paths, fail=True), paths, "compiling", LOG)
    err = io.StringIO()
    monkeypatch.setattr(startup, "show_progress", lambda: False)
    monkeypatch.setattr(startup.sys, "stderr", err)
    more = [tmp_path / "n.so"]
    startup.run_counting(writer(more), more, "compiling", LOG)
    assert more[0].exists() and err.getvalue() == ""
    # Nothing to build: the work still runs (ninja finds it up to date), silently.
    ran = []
    startup.run_counting(lambda: ran.append(1), [], "compiling", LOG)
    assert ran == [1]

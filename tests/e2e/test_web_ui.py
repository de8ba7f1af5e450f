"""The chat page at `/` in a real browser (headless Chromium driven by Selenium) against a
real router and the default model: a streamed answer with its stats, stop (the worker frees
the request), model output shown as text, API errors shown as messages, and a reasoning
parser's `reasoning_content` shown apart from the answer.

The router runs with `--max-requests 1`, so one request held from here makes the page's
next one a 429. Set MINISGL_SCREENSHOT=docs/chat-page.png to refresh the README's picture."""

import itertools
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.browser import MISSING, ChatPage, start_chromium, wait_until
from tests.e2e.conftest import Server, start_router, stop_router, wait_idle, worker_metrics

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

MODEL = "SmolLM2-135M-Instruct"
LONG = "Write a long story about a dragon who learns to fly."


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("web-ui"), "--max-requests", "1")
    yield server
    stop_router(server)


@pytest.fixture(scope="module")
def driver() -> Iterator:
    browser = start_chromium()
    yield browser
    browser.quit()


@pytest.fixture
def page(page_server: Server, driver) -> ChatPage:
    wait_idle(page_server.base_url)
    return ChatPage(driver, f"{page_server.base_url}/")


def test_an_answer_streams_in_and_its_stats_fill_in(page: ChatPage) -> None:
    assert page.by_id("model").text == MODEL
    page.settings(temperature=0, max_tokens=64)
    page.ask("What is the capital of France?")
    stats = page.last_note("stats")
    assert re.fullmatch(r"TTFT \d+\.\d\d s · \d+\.\d tok/s · \d+ tokens", stats), stats
    assert page.answer() == "The capital of France is Paris."
    growth = page.growth()
    # Token by token: several partial texts, each a prefix of the next.
    assert len(growth) >= 4, growth
    assert all(b.startswith(a) for a, b in itertools.pairwise(growth)), growth
    assert page.turns() == [("user", "What is the capital of France?"),
                            ("assistant", "The capital of France is Paris.")]
    shot = os.environ.get("MINISGL_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        assert page.driver.save_screenshot(shot)


def test_stop_aborts_the_request_in_the_worker(page: ChatPage, page_server: Server) -> None:
    before = worker_metrics(page_server.base_url)["generation_tokens_total"]
    page.settings(temperature=0, max_tokens=2000)
    page.ask(LONG)
    wait_until(lambda: len(page.answer()) > 40, 120, "the long answer to start")
    assert worker_metrics(page_server.base_url)["num_requests_running"] == 1
    page.by_id("stop").click()
    assert page.last_note("stats", 10) == "stopped"
    assert not page.busy()
    stopped_at = page.answer()
    after = wait_idle(page_server.base_url, timeout_s=10)  # the worker freed its slot and its KV
    # Far fewer than the 2000 tokens asked for were generated, and no more text came.
    assert after["generation_tokens_total"] - before < 500
    time.sleep(1)
    assert page.answer() == stopped_at


def test_model_output_is_shown_as_text_never_run(page: ChatPage) -> None:
    page.settings(temperature=0, max_tokens=40)
    page.ask("Repeat exactly: <img src=x onerror=window.pwned=1>")
    page.last_note("stats")
    assert "<img src=x onerror=window.pwned=1>" in page.answer()
    page.by_id("new-chat").click()
    assert page.turns() == []
    page.ask("Write a script tag in HTML that calls alert.")
    page.last_note("stats")
    code = page.js("return [...document.querySelectorAll('.turn.assistant pre code')]"
                   ".map(c => c.textContent)")
    assert any("<script>" in c for c in code), code  # a fenced block, shown as code
    assert page.js("return document.querySelectorAll('#log img, #log script').length") == 0
    assert page.js("return window.pwned === undefined")


def test_api_errors_show_as_messages(page: ChatPage, page_server: Server) -> None:
    page.settings(temperature=5, max_tokens=16)
    page.ask("Hello")
    error = page.last_note("error", 30)
    assert error.startswith("400: ") and "temperature" in error, error
    # Hold the one request `--max-requests 1` admits; the page's next one is refused.
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 2000, "stream": True}
    with requests.post(f"{page_server.base_url}/v1/chat/completions", json=body,
                       stream=True, timeout=120) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(lines).startswith(b"data: ")  # admitted and streaming
        page.settings(temperature=0, max_tokens=16)
        page.ask("What is the capital of France?")
        error = page.last_note("error", 30)
    assert error.startswith("429: ") and error.endswith("(retry after 1 s)"), error
    assert not page.busy()
    wait_idle(page_server.base_url)
    page.ask("What is the capital of France?")  # the same question, now admitted
    page.last_note("stats")
    assert page.answer() == "The capital of France is Paris."


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("web-ui-thinking"),
                          "--reasoning-parser", "deepseek-r1")
    yield server
    stop_router(server)


def test_reasoning_shows_apart_from_the_answer(thinking_server: Server, driver) -> None:
    """deepseek-r1's parser reads the output as reasoning until `</think>`, which the default
    model never writes: the page shows all of it in the reasoning block, as text, and an
    empty answer."""
    page = ChatPage(driver, f"{thinking_server.base_url}/")
    question = "Repeat exactly: <img src=x onerror=window.pwned=1>"
    page.settings(temperature=0, max_tokens=40)
    page.ask(question)
    page.last_note("stats")
    shown = page.js("const r = document.querySelectorAll('.turn.assistant .reasoning .prose');"
                    "return r.length ? r[r.length - 1].textContent : null;")
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}],
            "max_tokens": 40, "temperature": 0}
    r = requests.post(f"{thinking_server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert shown == r.json()["choices"][0]["message"]["reasoning_content"]
    assert "<img src=x onerror=window.pwned=1>" in shown
    assert page.answer() == ""
    assert page.js("return document.querySelector('.turn.assistant .reasoning').open")  # no answer
    assert page.js("return document.querySelectorAll('#log img').length") == 0
    assert page.js("return window.pwned === undefined")

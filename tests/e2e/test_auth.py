"""`--api-key` end to end: every route but /health and the chat page refuses a missing or
wrong key with 401 and answers with the key; the page in a real browser asks for the key
and then answers; `--shell` attaches with the key from MINISGL_API_KEY."""

import os
from collections.abc import Iterator

import pexpect
import pytest
import requests

from tests.e2e.browser import MISSING, ChatPage, start_chromium, wait_until
from tests.e2e.conftest import READY_TIMEOUT_S, Server, start_router, stop_router
from tests.e2e.test_shell import ANSWER, PROMPT, ROUTER, Shell

pytestmark = pytest.mark.slow

KEY = "sk-e2e-Zq8v"
MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16, "temperature": 0}
# (method, path, body): every route, each answered 200 once the key is there.
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "Paris is", "max_tokens": 4}),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"prompt": "hi"}),
    ("POST", "/detokenize", {"tokens": [42]}),
    ("POST", "/generate", {"text": "Paris is", "sampling_params": {"max_new_tokens": 4}}),
    ("GET", "/metrics", None),
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("auth"), "--api-key", KEY)
    yield server
    stop_router(server)


def call(server: Server, method: str, path: str, body: dict | None,
         key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return requests.request(method, server.base_url + path, json=body, headers=headers,
                            timeout=120)


def test_every_route_but_health_and_the_page_wants_the_key(keyed: Server) -> None:
    for method, path, body in [*ROUTES, ("GET", "/no-such-route", None)]:
        for key in (None, "sk-wrong"):
            r = call(keyed, method, path, body, key)
            assert r.status_code == 401, (path, key, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
    for method, path, body in ROUTES:
        r = call(keyed, method, path, body, KEY)
        assert r.status_code == 200, (path, r.text)
    assert call(keyed, "POST", "/v1/chat/completions", CHAT, KEY).json()[
        "choices"][0]["message"]["content"] == ANSWER
    for path in ("/health", "/", "/ui/chat.js", "/ui/chat.css"):
        assert call(keyed, "GET", path, None, None).status_code == 200, path


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_the_page_asks_for_the_key_then_answers(keyed: Server) -> None:
    driver = start_chromium()
    try:
        driver.get(f"{keyed.base_url}/")
        form = driver.find_element("id", "key-form")
        wait_until(form.is_displayed, 30, "the page asks for the key")
        assert driver.find_element("id", "model").text == "connecting…"  # nothing revealed
        key = driver.find_element("id", "key")
        key.send_keys("sk-wrong\n")
        # The key is kept before the form hides; a 401 brings the form back.
        wait_until(lambda: driver.execute_script(
            "return sessionStorage.getItem('minisgl-api-key') === 'sk-wrong'"
            " && !document.getElementById('key-form').hidden"), 30, "asked again")
        key.send_keys(KEY + "\n")
        wait_until(lambda: driver.find_element("id", "model").text == MODEL, 30,
                   "the model's name, read with the key")
        assert not form.is_displayed()
        page = ChatPage(driver, f"{keyed.base_url}/")  # a reload keeps the key (per tab)
        page.settings(temperature=0, max_tokens=16)
        page.ask("What is the capital of France?")
        page.last_note("stats")
        assert page.answer() == ANSWER
    finally:
        driver.quit()


def test_the_shell_sends_the_key_from_the_environment(keyed: Server) -> None:
    env = {**os.environ, "TERM": "xterm"}
    refused = pexpect.spawn(ROUTER, ["--shell", "--url", keyed.base_url], encoding="utf-8",
                            env={k: v for k, v in env.items() if k != "MINISGL_API_KEY"})
    refused.expect(pexpect.EOF, timeout=30)
    refused.close()
    assert refused.exitstatus == 1
    assert "401: this server needs an API key" in refused.before
    child = pexpect.spawn(ROUTER, ["--shell", "--url", keyed.base_url], encoding="utf-8",
                          timeout=READY_TIMEOUT_S, dimensions=(50, 250),
                          env={**env, "MINISGL_API_KEY": KEY})
    child.expect_exact(f"minisgl shell: {MODEL} at {keyed.base_url}", timeout=30)
    child.expect_exact(PROMPT)
    shell = Shell(child, keyed.base_url)
    assert shell.run("/set temperature 0") == "[temperature 0]"
    assert shell.answer("What is the capital of France?") == ANSWER
    child.sendline("/exit")
    child.expect(pexpect.EOF, timeout=30)
    child.close()
    assert child.exitstatus == 0

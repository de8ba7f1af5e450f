"""Headless Chromium (Debian's `chromium` and `chromium-driver`, which `make test` installs)
driven by Selenium: the chat page as a person uses it, plus a record of how the last answer
grew, to tell a streamed answer from one that appeared at once."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = (
    None
    if CHROMIUM and CHROMEDRIVER
    else "needs headless Chromium: Debian's `chromium` and `chromium-driver` packages "
    "(`make test` installs them with scripts/install-browser); "
    f"found chromium={CHROMIUM}, chromedriver={CHROMEDRIVER}"
)

# Every change to the last assistant answer's text, in order (installed before a send).
RECORD_ANSWER = """
window.__answers = [];
new MutationObserver(() => {
  const bodies = document.querySelectorAll('.turn.assistant .body');
  const text = bodies.length ? bodies[bodies.length - 1].textContent : '';
  const seen = window.__answers;
  if (text && seen[seen.length - 1] !== text) seen.push(text);
}).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
"""


def start_chromium() -> webdriver.Chrome:
    assert CHROMIUM and CHROMEDRIVER, MISSING
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1000,720", "--disable-gpu"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_until(what: Callable[[], Any], timeout_s: float = 120, why: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not reached within {timeout_s} s: {why}")


class ChatPage:
    def __init__(self, driver: webdriver.Chrome, url: str) -> None:
        self.driver = driver
        driver.get(url)
        wait_until(lambda: driver.find_element(By.ID, "model").text != "connecting…",
                   30, "the page's model request")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def by_id(self, element_id: str) -> Any:
        return self.driver.find_element(By.ID, element_id)

    def settings(self, temperature: float | str, max_tokens: int) -> None:
        self.js("document.getElementById('temperature').value = arguments[0];"
                "document.getElementById('max-tokens').value = arguments[1];",
                str(temperature), str(max_tokens))

    def ask(self, text: str) -> None:
        """Type a question and press Enter, as a person would."""
        self.js(RECORD_ANSWER)
        prompt = self.by_id("prompt")
        prompt.send_keys(text)
        prompt.send_keys("\n")

    def turns(self) -> list[tuple[str, str]]:
        return [(t.get_attribute("class").split()[1], t.find_element(By.CLASS_NAME, "body").text)
                for t in self.driver.find_elements(By.CSS_SELECTOR, "#log .turn")]

    def answer(self) -> str:
        """The last assistant answer's text as the page holds it."""
        return str(self.js("const b = document.querySelectorAll('.turn.assistant .body');"
                           "return b.length ? b[b.length - 1].textContent : '';"))

    def growth(self) -> list[str]:
        """Every text the last answer showed, in order (see RECORD_ANSWER)."""
        return list(self.js("return window.__answers;"))

    def last_note(self, css_class: str, timeout_s: float = 180) -> str:
        """The text of the last answer's stats line or error message, once it is there."""
        def find() -> str:
            turns = self.driver.find_elements(By.CSS_SELECTOR, "#log .turn.assistant")
            notes = turns[-1].find_elements(By.CLASS_NAME, css_class) if turns else []
            return str(notes[-1].text) if notes else ""
        return str(wait_until(find, timeout_s, f"a .{css_class} under the last answer"))

    def busy(self) -> bool:
        return bool(self.by_id("send").get_attribute("hidden") is not None)

"""What a request's omitted sampling fields become (router/src/api/sampling_defaults.rs), end
to end: OpenAI's temperature 1 with the default model, whose generation_config.json sets
none; greedy with a copy of it whose generation_config.json sets temperature 0, unless the
router is started with `--sampling-defaults openai`. Seeded, so every answer is reproducible."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from minisgl_worker.default_model import ensure_default_model

from tests.e2e.conftest import Server, start_router, stop_router

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def complete(server: Server, **params: object) -> str:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "seed": 5, **params}
    resp = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


def test_an_omitted_temperature_is_openais_1(server: Server) -> None:
    sampled = complete(server)
    assert sampled == complete(server, temperature=1.0)
    assert sampled != complete(server, temperature=0)


@pytest.fixture(scope="module")
def greedy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's files, but a generation_config.json that sets temperature 0."""
    source = Path(ensure_default_model())
    folder = tmp_path_factory.mktemp("greedy") / MODEL
    folder.mkdir()
    for path in source.iterdir():
        if path.name != "generation_config.json":
            (folder / path.name).symlink_to(path)
    config = json.loads((source / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "temperature": 0}))
    return folder


@pytest.fixture(scope="module", params=["model", "openai"])
def started(request: pytest.FixtureRequest, greedy_model: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    server = start_router(tmp_path_factory.mktemp("sampling"), "--model", str(greedy_model),
                          "--sampling-defaults", request.param)
    yield request.param, server
    stop_router(server)


def test_the_models_generation_config_sets_them(started: tuple[str, Server]) -> None:
    source, server = started
    omitted = complete(server)
    expected = complete(server, temperature=0 if source == "model" else 1.0)
    assert omitted == expected
    assert complete(server, temperature=0) != complete(server, temperature=1.0)
    log = server.log_path.read_text()
    want = "temperature 0," if source == "model" else "temperature 1,"
    assert f"sampling defaults: {want}" in log, log[-2000:]

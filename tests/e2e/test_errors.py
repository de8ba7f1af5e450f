"""Bad input gets a clear OpenAI-shaped error, never a hang or a 500."""

import pytest
import requests

from tests.e2e.conftest import Server

MODEL = "SmolLM2-135M-Instruct"


def post(server: Server, path: str, **kwargs: object) -> requests.Response:
    return requests.post(f"{server.base_url}{path}", timeout=60, **kwargs)  # type: ignore[arg-type]


def error_of(resp: requests.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert set(body) >= {"message", "type", "param", "code"}
    assert body["message"]
    return body


def test_malformed_json_is_400(server: Server) -> None:
    resp = post(
        server,
        "/v1/chat/completions",
        data=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    error_of(resp, 400)


def test_prompt_longer_than_context_is_400_naming_the_limit(server: Server) -> None:
    resp = post(
        server,
        "/v1/completions",
        json={"model": MODEL, "prompt": "hello " * 9000, "max_tokens": 4},
    )
    body = error_of(resp, 400)
    assert "8192" in body["message"]


def test_max_tokens_past_the_context_is_400(server: Server) -> None:
    resp = post(
        server, "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 9000}
    )
    body = error_of(resp, 400)
    assert "8192" in body["message"]


def test_unknown_route_is_404_json(server: Server) -> None:
    error_of(requests.get(f"{server.base_url}/v1/nope"), 404)


def test_unknown_model_is_404(server: Server) -> None:
    resp = post(server, "/v1/completions", json={"model": "gpt-9", "prompt": "hi"})
    body = error_of(resp, 404)
    assert "gpt-9" in body["message"]


@pytest.mark.parametrize(
    "field, value, needle",
    [("top_p", 1.5, "top_p"), ("temperature", -1, "temperature"), ("max_tokens", 0, "max_tokens")],
)
def test_out_of_range_values_name_the_field(
    server: Server, field: str, value: float, needle: str
) -> None:
    resp = post(server, "/v1/completions", json={"model": MODEL, "prompt": "hi", field: value})
    assert needle in error_of(resp, 400)["message"]


def test_unknown_parameter_is_rejected_by_name(server: Server) -> None:
    resp = post(
        server,
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "best_of": 3},
    )
    assert "best_of" in error_of(resp, 400)["message"]


def test_server_still_answers_after_bad_requests(server: Server) -> None:
    resp = post(
        server,
        "/v1/completions",
        json={"model": MODEL, "prompt": "One, two,", "max_tokens": 3, "temperature": 0},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 3

"""The official `openai` Python client against Narwhal, unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import MODEL, fleet_config, sim_process
from tests.processes import NarwhalProcess, router_process

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def router() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0") as sim:
        with router_process(fleet_config([("s0", sim, "vllm")])) as process:
            yield process


@pytest.fixture
def client(router: NarwhalProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-unknown")


def test_non_streaming_chat_with_tool_calls(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "#sim:tool_calls weather in Paris and Oslo?"}],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # calls only: no text, as OpenAI and vLLM answer
    calls = choice.message.tool_calls or []
    assert len(calls) == 2
    for call in calls:
        assert call.id and call.type == "function"
        assert call.function.name and isinstance(call.function.arguments, str)
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_streaming_chat_with_tool_calls(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "#sim:tool_calls weather?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                arguments[call.index] = arguments.get(call.index, "") + (
                    (call.function.arguments if call.function else None) or ""
                )
                if call.function and call.function.name:
                    names[call.index] = call.function.name
    assert sorted(arguments) == [0, 1] and all(names.values())
    assert usage is not None and usage.completion_tokens > 0


def test_streaming_chat_text(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], stream=True, max_tokens=12
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def test_completions_with_logprobs(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt="Once", max_tokens=6, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert len(logprobs.tokens) == completion.usage.completion_tokens  # type: ignore[union-attr]
    stream = client.completions.create(model=MODEL, prompt="Once", max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)


def test_refusals_become_client_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], n=2
        )
    assert info.value.body["message"] == "Invalid sampling width"  # type: ignore[index]


def test_engine_failure_raises_whether_before_or_after_headers(client: openai.OpenAI) -> None:
    # Before headers it is a 502 status; after them an error event, which the client raises.
    with pytest.raises(openai.APIError):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "#sim:error_midstream=6 go"}],
            stream=True,
            max_tokens=30,
        )
        for _ in stream:
            pass

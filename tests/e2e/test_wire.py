"""Wire fidelity: what a client gets through Narwhal is what vLLM would give it directly,
where Narwhal's own upstream request (always a stream, always `return_token_ids`) would
change vLLM's answer. Against `narwhal sim` (vLLM dialect), which answers these cases as
vLLM 0.32 does (PROTOCOL.md §7): the echo blanked when IDs are asked, `prompt_logprobs`
refused when streamed, 400s with `param`, `max_model_len` on /v1/models.

Each case compares the router's answer with the sim's own answer to the same body, and
checks the accounting: one counted outcome, no engine blamed, nothing retried.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import (
    MODEL,
    Reply,
    chat,
    completion,
    fleet_config,
    metrics_of,
    send,
    sim_process,
)
from tests.e2e.test_relay import data_events, without_identity
from tests.processes import NarwhalProcess, router_process

CONTEXT = 1024


@pytest.fixture(scope="module")
def arrivals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wire") / "arrivals.log"


@pytest.fixture(scope="module")
def sim(arrivals: Path) -> Iterator[NarwhalProcess]:
    flags = ("--time-scale", "0", "--seed", "7", "--max-model-len", str(CONTEXT))
    with sim_process(*flags, "--arrival-log", str(arrivals)) as process:
        yield process


@pytest.fixture(scope="module")
def router(sim: NarwhalProcess) -> Iterator[NarwhalProcess]:
    # Two attempts: a failure blamed on the engine would be retried, and would show.
    config = fleet_config([("v0", sim, "vllm")], fleet={"max_attempts": 2})
    with router_process(config) as process:
        yield process


class Books:
    """The router's counters before a case, to compare with after it."""

    def __init__(self, values: dict[str, float], arrived: int) -> None:
        self.values = values
        self.arrived = arrived

    @classmethod
    async def open(cls, router: NarwhalProcess, arrivals: Path) -> Books:
        return cls(await metrics_of(router.url), _arrived(arrivals))

    async def changes(self, router: NarwhalProcess) -> dict[str, float]:
        after = await metrics_of(router.url)
        return {
            key: value - self.values.get(key, 0.0)
            for key, value in after.items()
            if value != self.values.get(key, 0.0) and not key.endswith(("_bucket", "_sum"))
        }

    def engine_requests(self, arrivals: Path) -> int:
        return _arrived(arrivals) - self.arrived


def _arrived(arrivals: Path) -> int:
    return len(arrivals.read_text().splitlines()) if arrivals.exists() else 0


def outcome(changes: dict[str, float], name: str) -> float:
    return changes.get(f'narwhal_outcomes_total{{outcome="{name}"}}', 0.0)


def engine_failures(changes: dict[str, float]) -> float:
    return sum(v for k, v in changes.items() if k.startswith("narwhal_engine_failures_total"))


def completion_tokens(changes: dict[str, float], route: str, stream: bool) -> float:
    key = f'narwhal_completion_tokens_total{{route="{route}",stream="{str(stream).lower()}"}}'
    return changes.get(key, 0.0)


def texts(reply: Reply) -> str:
    return "".join(c.get("text") or "" for e in data_events(reply) for c in e["choices"])


# --- echo ----------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", ["Once upon a time", [5, 17, 42, 99]])
async def test_a_streamed_echo_keeps_the_prompt_text(
    router: NarwhalProcess, sim: NarwhalProcess, arrivals: Path, prompt: Any
) -> None:
    """The sim, as vLLM, blanks the echo when asked for IDs, which the router always asks
    for; the client (who did not) gets the engine's answer without IDs, event for event."""
    body = completion(prompt, echo=True, stream=True, max_tokens=6)
    blanked = await send(sim.url, {**body, "return_token_ids": True})
    direct = await send(sim.url, body)
    books = await Books.open(router, arrivals)
    relayed = await send(router.url, body)
    assert relayed.status == 200, relayed.raw
    # The echo chunk: the prompt's text and the first token's, the first blanked with IDs,
    # the prompt's IDs on it either way.
    echoed, bare = (data_events(r)[0]["choices"][0] for r in (direct, blanked))
    assert echoed["text"].endswith(bare["text"]) and len(echoed["text"]) > len(bare["text"])
    assert echoed["prompt_token_ids"] is not None
    assert echoed["prompt_token_ids"] == bare["prompt_token_ids"]
    assert [without_identity(e) for e in data_events(relayed)] == [
        without_identity(e) for e in data_events(direct)
    ]
    if isinstance(prompt, str):
        assert texts(relayed).startswith(prompt)
    changes = await books.changes(router)
    assert outcome(changes, "completed") == 1 and books.engine_requests(arrivals) == 1
    assert completion_tokens(changes, "completion", True) == 6  # the output, not the prompt


@pytest.mark.parametrize("prompt", ["Once upon a time", [5, 17, 42, 99]])
async def test_an_assembled_echo_keeps_the_prompt_text(
    router: NarwhalProcess, sim: NarwhalProcess, arrivals: Path, prompt: Any
) -> None:
    body = completion(prompt, echo=True, max_tokens=6)
    direct = (await send(sim.url, body)).json()
    books = await Books.open(router, arrivals)
    reply = await send(router.url, body)
    assert reply.status == 200, reply.raw
    relayed = reply.json()
    got, want = relayed["choices"][0], direct["choices"][0]
    assert got["text"] == want["text"]
    if isinstance(prompt, str):
        assert got["text"].startswith(prompt) and len(got["text"]) > len(prompt)
    assert got["prompt_token_ids"] is None and got["token_ids"] is None  # as vLLM's own
    for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert relayed["usage"][count] == direct["usage"][count]
    changes = await books.changes(router)
    assert outcome(changes, "completed") == 1
    assert completion_tokens(changes, "completion", False) == direct["usage"]["completion_tokens"]


async def test_an_echo_with_ids_is_blanked_as_vllm_blanks_it(
    router: NarwhalProcess, sim: NarwhalProcess
) -> None:
    body = completion("Once upon a time", echo=True, max_tokens=6, return_token_ids=True)
    direct = (await send(sim.url, body)).json()["choices"][0]
    relayed = (await send(router.url, body)).json()["choices"][0]
    assert not relayed["text"].startswith("Once") and relayed["text"] == direct["text"]
    assert relayed["prompt_token_ids"] == direct["prompt_token_ids"]
    assert len(relayed["token_ids"]) == 6


def continued(**fields: Any) -> dict[str, Any]:
    """A chat whose last message is the assistant's, which vLLM's echo sends back."""
    messages = [
        {"role": "user", "content": "Tell me a story"},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    return chat(messages=messages, echo=True, max_tokens=6, **fields)


async def test_a_chat_echo_is_relayed_not_blamed_on_the_engine(
    router: NarwhalProcess, sim: NarwhalProcess, arrivals: Path
) -> None:
    """vLLM sends chat's echo as an event without IDs, whatever was asked: not output,
    so not a missing-ID failure (it was a 502 after two attempts)."""
    streamed = [continued(stream=True), continued(stream=True, return_token_ids=True)]
    directs = [await send(sim.url, body) for body in streamed]
    body = continued()
    direct_answer = (await send(sim.url, body)).json()
    books = await Books.open(router, arrivals)
    for streamed_body, direct in zip(streamed, directs, strict=True):
        relayed = await send(router.url, streamed_body)
        assert relayed.status == 200, relayed.raw
        events = data_events(relayed)
        assert events[1]["choices"][0]["delta"] == {"content": "Once upon a time"}
        assert [without_identity(e) for e in events] == [
            without_identity(e) for e in data_events(direct)
        ]
    reply = await send(router.url, body)
    assert reply.status == 200, reply.raw
    content = reply.json()["choices"][0]["message"]["content"]
    assert content == direct_answer["choices"][0]["message"]["content"]
    assert content.startswith("Once upon a time") and len(content) > len("Once upon a time")
    changes = await books.changes(router)
    assert outcome(changes, "completed") == 3 and engine_failures(changes) == 0
    assert books.engine_requests(arrivals) == 3
    assert completion_tokens(changes, "chat", True) == 12  # the echo is no output
    assert completion_tokens(changes, "chat", False) == 6


# --- prompt_logprobs: answered only without streaming -----------------------------------


@pytest.mark.parametrize("make", [chat, completion])
async def test_prompt_logprobs_are_answered_unstreamed_for_a_non_streaming_client(
    router: NarwhalProcess, sim: NarwhalProcess, arrivals: Path, make: Any
) -> None:
    body = make("Describe the sea", max_tokens=5, prompt_logprobs=1)
    direct = (await send(sim.url, body)).json()
    books = await Books.open(router, arrivals)
    reply = await send(router.url, body)
    assert reply.status == 200, reply.raw
    relayed = reply.json()
    # vLLM's own answer, as it gives it without IDs: the same keys, the same values.
    assert without_identity(relayed) == without_identity(direct)
    prompt_logprobs = (
        relayed["prompt_logprobs"]
        if "messages" in body
        else relayed["choices"][0]["prompt_logprobs"]
    )
    assert len(prompt_logprobs) == relayed["usage"]["prompt_tokens"]
    assert relayed["choices"][0]["finish_reason"] == "length"
    changes = await books.changes(router)
    assert outcome(changes, "completed") == 1 and engine_failures(changes) == 0
    assert books.engine_requests(arrivals) == 1
    route = "chat" if "messages" in body else "completion"
    assert completion_tokens(changes, route, False) == 5
    assert changes['narwhal_output_tokens_total{engine="v0",source="token_ids"}'] == 5


async def test_unstreamed_ids_reach_a_client_that_asks(router: NarwhalProcess) -> None:
    reply = await send(
        router.url,
        completion("Describe the sea", max_tokens=5, prompt_logprobs=2, return_token_ids=True),
    )
    choice = reply.json()["choices"][0]
    assert len(choice["token_ids"]) == 5 and choice["prompt_token_ids"]
    assert len(choice["prompt_logprobs"]) == len(choice["prompt_token_ids"])


@pytest.mark.parametrize("make", [chat, completion])
async def test_streamed_prompt_logprobs_get_the_engines_400_with_its_param(
    router: NarwhalProcess, sim: NarwhalProcess, arrivals: Path, make: Any
) -> None:
    body = make("Describe the sea", stream=True, max_tokens=5, prompt_logprobs=1)
    direct = await send(sim.url, body)
    assert direct.status == 400 and direct.json()["error"]["param"] == "prompt_logprobs"
    books = await Books.open(router, arrivals)
    reply = await send(router.url, body)
    assert reply.status == 400
    error = reply.json()["error"]
    # The engine's field, in Narwhal's envelope (a string code or null, never vLLM's 400).
    assert error["param"] == "prompt_logprobs" and error["code"] is None
    assert error["type"] == "invalid_request_error"
    assert "prompt_logprobs" in error["message"]
    changes = await books.changes(router)
    assert outcome(changes, "invalid") == 1 and engine_failures(changes) == 0
    assert books.engine_requests(arrivals) == 1  # not retried


async def test_an_engine_400_keeps_its_param(router: NarwhalProcess) -> None:
    reply = await send(router.url, completion("#sim:no_such_scenario hello", max_tokens=3))
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "prompt" and error["code"] is None
    assert error["message"].startswith("The engine refused the request:")


# --- batches -------------------------------------------------------------------------------


async def test_a_batch_of_prompts_is_a_400_naming_prompt_before_any_engine(
    router: NarwhalProcess, arrivals: Path
) -> None:
    books = await Books.open(router, arrivals)
    for prompt in (["Once upon", "a time"], [[5, 6], [7, 8]]):
        for stream in (False, True):
            reply = await send(router.url, completion(prompt, stream=stream, max_tokens=3))
            assert reply.status == 400, reply.raw
            error = reply.json()["error"]
            assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    changes = await books.changes(router)
    assert outcome(changes, "invalid") == 4 and engine_failures(changes) == 0
    assert outcome(changes, "upstream_error") == 0
    assert books.engine_requests(arrivals) == 0


@pytest.mark.parametrize("prompt", [["Once upon a time"], [[5, 6, 7]], [5, 6, 7]])
async def test_one_prompt_in_a_list_is_served_as_the_engine_serves_it(
    router: NarwhalProcess, sim: NarwhalProcess, prompt: Any
) -> None:
    body = completion(prompt, max_tokens=4)
    direct = (await send(sim.url, body)).json()
    reply = await send(router.url, body)
    assert reply.status == 200, reply.raw
    relayed = reply.json()
    assert [c["index"] for c in relayed["choices"]] == [0]
    assert relayed["choices"][0]["text"] == direct["choices"][0]["text"]
    assert relayed["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


# --- the context --------------------------------------------------------------------------


async def card(url: str, path: str = "/v1/models") -> Any:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        assert resp.status == 200
        return await resp.json()


async def test_models_carry_the_engines_max_model_len(
    router: NarwhalProcess, sim: NarwhalProcess
) -> None:
    engine = (await card(sim.url))["data"][0]["max_model_len"]
    assert engine == CONTEXT
    assert (await card(router.url))["data"][0]["max_model_len"] == engine
    assert (await card(router.url, f"/v1/models/{MODEL}"))["max_model_len"] == engine


@pytest.mark.parametrize(
    ("body", "param", "counts"),
    [
        # Token IDs: an exact count.
        (completion(list(range(10, 10 + CONTEXT))), "prompt", f"has {CONTEXT} tokens"),
        (completion(list(range(10, 1010)), max_tokens=100), "max_tokens", "1100 tokens"),
        # Text, sized by an estimate: refused on its least (a quarter of the estimate).
        (chat(" word" * 5000), "messages", "at least"),
        (chat(" word" * 600, max_completion_tokens=2000), "max_completion_tokens", "at least"),
    ],
)
async def test_a_request_beyond_the_context_is_400_before_any_engine(
    router: NarwhalProcess, arrivals: Path, body: dict[str, Any], param: str, counts: str
) -> None:
    books = await Books.open(router, arrivals)
    for stream in (False, True):
        reply = await send(router.url, {**body, "stream": stream})
        assert reply.status == 400, reply.raw
        error = reply.json()["error"]
        assert error["code"] == "context_length_exceeded", error
        assert error["type"] == "invalid_request_error" and error["param"] == param
        assert f"maximum context length is {CONTEXT} tokens" in error["message"]
        assert counts in error["message"]
    changes = await books.changes(router)
    assert outcome(changes, "invalid") == 2 and changes["narwhal_invalid_requests_total"] == 2
    assert books.engine_requests(arrivals) == 0


async def test_an_estimate_that_may_fit_goes_to_the_engine(
    sim: NarwhalProcess, arrivals: Path
) -> None:
    """About 2,000 estimated tokens at a 1,024 context, on a router that has not learned
    how its estimates compare with the engine's counts (bounds 0.3-1.5 until it has): the
    estimate's error bound says it may fit, so the engine, which counts exactly, answers
    (its own 400 here). Once the bounds are learned (the module's router, whose sim counts
    as the estimate does), the same prompt is refused before any engine work."""
    config = fleet_config([("v0", sim, "vllm")], fleet={"max_attempts": 2})
    with router_process(config) as fresh:
        books = await Books.open(fresh, arrivals)
        reply = await send(fresh.url, completion(" word" * 2000, max_tokens=4))
        assert reply.status == 400
        error = reply.json()["error"]
        assert error["code"] is None and error["message"].startswith("The engine refused")
        assert books.engine_requests(arrivals) == 1

"""The non-streaming assembler, one test per row of the seed's table ("Non-streaming
assembly", "Metadata and usage") and per PROTOCOL.md fact it relies on. The 502
rules are in test_assembly_validation.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineOutputError, Route
from narwhal.protocol.exposure import Exposure

NO_IDS = Exposure(token_ids=False, usage=True, continuous_usage=False)
IDS = Exposure(token_ids=True, usage=True, continuous_usage=False)


def chunk(*choices: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": list(choices),
        **top,
    }


def delta(index: int = 0, finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "logprobs": None, "finish_reason": finish}


def text(value: Any, index: int = 0, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"index": index, "text": value, "logprobs": None, "finish_reason": finish, **extra}


def assemble(
    events: Iterable[dict[str, Any]],
    route: Route = "chat",
    exposure: Exposure = NO_IDS,
    prompt_tokens: int = 5,
    completion_tokens: int = 7,
) -> dict[str, Any]:
    assembler = Assembler(route, exposure)
    for event in events:
        assembler.add(event)
    return assembler.result(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def message(result: dict[str, Any], index: int = 0) -> dict[str, Any]:
    choice: dict[str, Any] = result["choices"][index]
    return choice["message"]  # type: ignore[no-any-return]


# --- Chat content / reasoning / reasoning_content / refusal -------------------------


def test_chat_content_concatenates() -> None:
    result = assemble(
        [
            chunk(delta(role="assistant", content="")),
            chunk(delta(content="Hel")),
            chunk(delta(content="lo")),
            chunk(delta(content=None)),
            chunk(delta(content=" wörld", finish="stop")),
        ]
    )
    assert message(result) == {"role": "assistant", "content": "Hello wörld"}
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["finish_reason"] == "stop"


def test_chat_content_is_none_when_never_a_string() -> None:
    result = assemble([chunk(delta(role="assistant", content=None)), chunk(delta(finish="stop"))])
    assert message(result) == {"role": "assistant", "content": None}


def test_chat_reasoning_concatenates() -> None:
    result = assemble(
        [
            chunk(delta(reasoning="Let me")),
            chunk(delta(reasoning=" think")),
            chunk(delta(content="42", finish="stop")),
        ]
    )
    assert message(result) == {"role": "assistant", "content": "42", "reasoning": "Let me think"}


def test_chat_reasoning_content_concatenates() -> None:
    result = assemble(
        [
            chunk(delta(reasoning_content="Hm")),
            chunk(delta(reasoning_content="m.")),
            chunk(delta(content="ok", finish="stop")),
        ]
    )
    assert message(result) == {"role": "assistant", "content": "ok", "reasoning_content": "Hmm."}


def test_reasoning_and_reasoning_content_kept_apart() -> None:
    # vLLM 0.11.1 to 0.15.1 sends both (PROTOCOL.md §2.2); each keeps its own name.
    result = assemble(
        [
            chunk(delta(reasoning="a", reasoning_content="a")),
            chunk(delta(reasoning="b", reasoning_content=None)),
            chunk(delta(reasoning=None, reasoning_content="c")),
            chunk(delta(content="x", finish="stop")),
        ]
    )
    assert message(result)["reasoning"] == "ab"
    assert message(result)["reasoning_content"] == "ac"


def test_vllm_015_reasoning_content_null_on_every_delta() -> None:
    # The nulls are not text (nothing concatenates into a string), and the message keeps
    # them null, as the engine's own non-streaming message has them.
    result = assemble(
        [
            chunk(delta(role="assistant", content="", reasoning=None, reasoning_content=None)),
            chunk(delta(content="Hi", reasoning_content=None)),
            chunk(delta(content="!", reasoning_content=None, finish="stop")),
        ]
    )
    assert message(result) == {
        "role": "assistant",
        "content": "Hi!",
        "reasoning": None,
        "reasoning_content": None,
    }


def test_sglang_null_message_fields_stay_null() -> None:
    # SGLang writes its unset fields as nulls on every delta (PROTOCOL.md §6.1); its own
    # non-streaming message has the same keys, null.
    nulls = {"reasoning_content": None, "tool_calls": None}
    result = assemble(
        [
            chunk(delta(role="assistant", content="", **nulls)),
            chunk(delta(content="Hi", **nulls)),
            chunk(delta(content=None, **nulls, finish="stop")),
        ]
    )
    assert message(result) == {
        "role": "assistant",
        "content": "Hi",
        "reasoning_content": None,
        "tool_calls": None,
    }


def test_a_value_wins_over_the_nulls_around_it() -> None:
    result = assemble(
        [
            chunk(delta(role="assistant", content=None, tool_calls=None, function_call=None)),
            chunk(
                delta(
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ]
                )
            ),
            chunk(delta(content=None, tool_calls=None, finish="tool_calls")),
        ]
    )
    got = message(result)
    assert got["content"] is None
    assert got["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert got["function_call"] is None


def test_chat_refusal_concatenates() -> None:
    result = assemble(
        [
            chunk(delta(role="assistant", content=None, refusal="I can")),
            chunk(delta(refusal="not help.", finish="stop")),
        ]
    )
    assert message(result) == {"role": "assistant", "content": None, "refusal": "I cannot help."}


def test_empty_string_fragments_count_as_seen() -> None:
    result = assemble([chunk(delta(content="", reasoning="", finish="stop"))])
    assert message(result) == {"role": "assistant", "content": "", "reasoning": ""}


# --- tool_calls ---------------------------------------------------------------------


def call(index: int, **fields: Any) -> dict[str, Any]:
    return {"index": index, **fields}


def test_tool_calls_grouped_by_index_in_index_order() -> None:
    result = assemble(
        [
            chunk(delta(tool_calls=[call(1, id="b", type="function", function={"name": "g"})])),
            chunk(delta(tool_calls=[call(0, id="a", type="function", function={"name": "f"})])),
            chunk(delta(tool_calls=[call(1, function={"arguments": '{"y":'})])),
            chunk(delta(tool_calls=[call(0, function={"arguments": '{"x":'})])),
            chunk(
                delta(
                    tool_calls=[call(0, function={"arguments": "1}"}), call(1, function={})],
                )
            ),
            chunk(delta(tool_calls=[call(1, function={"arguments": "2}"})], finish="tool_calls")),
        ]
    )
    assert message(result)["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"y":2}'}},
    ]


def test_tool_call_id_name_and_arguments_concatenate_independently() -> None:
    result = assemble(
        [
            chunk(delta(tool_calls=[call(0, id="call_", function={"name": "get_"})])),
            chunk(delta(tool_calls=[call(0, id="7", function={"name": "weather"})])),
            chunk(delta(tool_calls=[call(0, function={"arguments": "{}"})], finish="tool_calls")),
        ]
    )
    assert message(result)["tool_calls"] == [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ]


def test_tool_arguments_on_the_finishing_chunk() -> None:
    # vLLM's finalize_generation adds unstreamed argument text to the last call (§2.2).
    result = assemble(
        [
            chunk(delta(tool_calls=[call(0, id="t", type="function", function={"name": "f"})])),
            chunk(delta(tool_calls=[call(0, function={"arguments": '{"city": "Par'})])),
            chunk(delta(tool_calls=[call(0, function={"arguments": 'is"}'})], finish="tool_calls")),
        ]
    )
    assert message(result)["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert result["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_arguments_are_never_parsed_or_repaired() -> None:
    result = assemble(
        [
            chunk(delta(tool_calls=[call(0, id="t", function={"name": "f", "arguments": "{'a'"})])),
            chunk(delta(finish="length")),
        ]
    )
    assert message(result)["tool_calls"][0]["function"]["arguments"] == "{'a'"


def test_tool_call_without_arguments_has_empty_arguments() -> None:
    result = assemble(
        [
            chunk(delta(tool_calls=[call(0, id="t", function={"name": "f"})])),
            chunk(delta(finish="tool_calls")),
        ]
    )
    assert message(result)["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}


def test_whole_tool_call_in_one_delta() -> None:
    # transformers serve sends each call whole (PROTOCOL.md §6.3).
    whole = call(
        0, id="req_tool_call_0", type="function", function={"name": "f", "arguments": "{}"}
    )
    result = assemble(
        [chunk(delta(content="Calling", tool_calls=[whole])), chunk(delta(finish="tool_calls"))]
    )
    assert message(result) == {
        "role": "assistant",
        "content": "Calling",
        "tool_calls": [
            {
                "id": "req_tool_call_0",
                "type": "function",
                "function": {"name": "f", "arguments": "{}"},
            }
        ],
    }


def test_a_call_with_no_text_has_content_null_as_vllm_answers() -> None:
    """vLLM's stream opens with `"content": ""`; its own non-streaming answer to the same
    request has content null when the model only called (tool parsers give None for
    empty text), as OpenAI's does. Text beside a call stays."""
    opening = chunk(delta(role="assistant", content=""))
    first = call(0, id="t", type="function", function={"name": "f", "arguments": "{}"})
    only_call = assemble([opening, chunk(delta(tool_calls=[first], finish="tool_calls"))])
    assert message(only_call)["content"] is None
    legacy = assemble([opening, chunk(delta(function_call={"name": "f"}, finish="stop"))])
    assert message(legacy)["content"] is None
    with_text = assemble(
        [
            opening,
            chunk(delta(content="Calling")),
            chunk(delta(tool_calls=[first], finish="tool_calls")),
        ]
    )
    assert message(with_text)["content"] == "Calling"
    assert message(assemble([opening, chunk(delta(finish="stop"))]))["content"] == ""


def test_tool_call_without_id_is_a_502() -> None:
    with pytest.raises(EngineOutputError, match="tool call at index 0 has no id"):
        assemble(
            [
                chunk(delta(tool_calls=[call(0, function={"name": "f", "arguments": "{}"})])),
                chunk(delta(finish="tool_calls")),
            ]
        )


def test_tool_call_without_name_is_a_502() -> None:
    with pytest.raises(EngineOutputError, match="tool call at index 1 has no function name"):
        assemble(
            [
                chunk(delta(tool_calls=[call(0, id="a", function={"name": "f"})])),
                chunk(delta(tool_calls=[call(1, id="b", function={"arguments": "{}"})])),
                chunk(delta(finish="tool_calls")),
            ]
        )


def test_tool_call_with_empty_id_is_a_502() -> None:
    with pytest.raises(EngineOutputError, match="no id"):
        assemble([chunk(delta(tool_calls=[call(0, id="", function={"name": "f"})], finish="stop"))])


# --- Legacy function_call -----------------------------------------------------------


def test_legacy_function_call_concatenates() -> None:
    result = assemble(
        [
            chunk(delta(role="assistant", content=None, function_call={"name": "get_"})),
            chunk(delta(function_call={"name": "time", "arguments": ""})),
            chunk(delta(function_call={"arguments": '{"tz":'})),
            chunk(delta(function_call={"arguments": '"UTC"}'}, finish="function_call")),
        ]
    )
    assert message(result) == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_time", "arguments": '{"tz":"UTC"}'},
    }
    assert result["choices"][0]["finish_reason"] == "function_call"


def test_legacy_function_call_without_name_is_a_502() -> None:
    with pytest.raises(EngineOutputError, match="function_call has no name"):
        assemble([chunk(delta(function_call={"arguments": "{}"}, finish="function_call"))])


def test_empty_function_call_object_is_nothing() -> None:
    result = assemble([chunk(delta(content="x", function_call={}, finish="stop"))])
    assert "function_call" not in message(result)


# --- Chat logprobs ------------------------------------------------------------------


def entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def test_chat_logprobs_content_and_refusal_concatenate_in_order() -> None:
    first, second = delta(content="a"), delta(refusal="n")
    first["logprobs"] = {"content": [entry("a", -0.1)], "refusal": None}
    second["logprobs"] = {"content": None, "refusal": [entry("n", -0.2)]}
    third = delta(content="b", finish="stop")
    third["logprobs"] = {"content": [entry("b", -0.3), entry("c", -9999.0)], "refusal": []}
    result = assemble([chunk(first), chunk(delta(content="")), chunk(second), chunk(third)])
    assert result["choices"][0]["logprobs"] == {
        "content": [entry("a", -0.1), entry("b", -0.3), entry("c", -9999.0)],
        "refusal": [entry("n", -0.2)],
    }


def test_chat_logprobs_without_refusal_list() -> None:
    # vLLM sends no refusal list (PROTOCOL.md §2.2).
    first = delta(content="a", finish="stop")
    first["logprobs"] = {"content": [entry("a", -0.1)]}
    result = assemble([chunk(first)])
    assert result["choices"][0]["logprobs"] == {"content": [entry("a", -0.1)]}


def test_chat_logprobs_none_when_engine_sent_none() -> None:
    result = assemble([chunk(delta(content="a")), chunk(delta(finish="stop"))])
    assert result["choices"][0]["logprobs"] is None


# --- Text-completion logprobs -------------------------------------------------------


def test_text_completion_logprobs_concatenate_in_order() -> None:
    a = text("A", logprobs=None)
    a["logprobs"] = {
        "text_offset": [0],
        "token_logprobs": [-0.5],
        "tokens": ["A"],
        "top_logprobs": [{"A": -0.5}],
    }
    b = text(" b c", finish="stop")
    b["logprobs"] = {
        "text_offset": [1, 3],
        "token_logprobs": [None, -1],
        "tokens": [" b", " c"],
        "top_logprobs": [None, {" c": -1}],
    }
    result = assemble([chunk(a), chunk(b)], route="completion")
    choice = result["choices"][0]
    assert choice["text"] == "A b c"
    assert choice["logprobs"] == {
        "text_offset": [0, 1, 3],
        "token_logprobs": [-0.5, None, -1],
        "tokens": ["A", " b", " c"],
        "top_logprobs": [{"A": -0.5}, None, {" c": -1}],
    }
    assert result["object"] == "text_completion"


def test_llamacpp_completion_logprobs_in_chat_shape() -> None:
    # llama.cpp answers completions with {"content": [...]} (PROTOCOL.md §6.2).
    a, b = text("x"), text("y", finish="stop")
    a["logprobs"] = {"content": [entry("x", -0.1)]}
    b["logprobs"] = {"content": [entry("y", -0.2)]}
    result = assemble([chunk(a), chunk(b)], route="completion")
    assert result["choices"][0]["logprobs"] == {"content": [entry("x", -0.1), entry("y", -0.2)]}


def test_text_completion_concatenates_and_null_text_is_nothing() -> None:
    result = assemble(
        [chunk(text(" Par")), chunk(text(None)), chunk(text("is", finish="length"))],
        route="completion",
    )
    assert result["choices"][0] == {
        "index": 0,
        "text": " Paris",
        "logprobs": None,
        "finish_reason": "length",
    }


# --- Metadata -----------------------------------------------------------------------


def test_response_metadata_is_kept() -> None:
    kv = {"do_remote_prefill": True, "remote_block_ids": [[1]]}
    result = assemble(
        [
            chunk(delta(content="a"), kv_transfer_params=None, prompt_text=None, obfuscation="xx"),
            chunk(delta(content="b", finish="stop"), kv_transfer_params=kv),
            chunk(system_fingerprint="vllm-0.33.0", metrics={"ttft": 0.1}, obfuscation="yyy"),
            chunk(kv_transfer_params=None, usage={"prompt_tokens": 1, "completion_tokens": 2}),
        ]
    )
    assert result == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ab"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "kv_transfer_params": kv,  # a later null never erases it
        "prompt_text": None,
        "system_fingerprint": "vllm-0.33.0",
        "metrics": {"ttft": 0.1},
        "usage": {"prompt_tokens": 1, "completion_tokens": 2},
    }
    assert list(result)[:5] == ["id", "object", "created", "model", "choices"]


def test_engine_specific_top_level_metadata_is_kept() -> None:
    result = assemble(
        [chunk(delta(content="a", finish="stop"), timings={"predicted_n": 1}, service_tier=None)]
    )
    assert result["timings"] == {"predicted_n": 1}
    assert result["service_tier"] is None


def test_choice_metadata_is_kept() -> None:
    first = delta(content="a")
    first["weight_versions"] = None
    last = delta(finish="stop")
    last.update(stop_reason=None, weight_versions=["v3"], matched_stop=151645, routed_experts=None)
    result = assemble([chunk(first), chunk(last)])
    choice = result["choices"][0]
    assert choice["weight_versions"] == ["v3"]
    assert choice["matched_stop"] == 151645
    assert choice["routed_experts"] is None
    assert choice["stop_reason"] is None


# --- finish_reason and stop_reason --------------------------------------------------


def test_finish_and_stop_reason_survive_usage_only_frames() -> None:
    finishing = delta(content="x", finish="stop")
    finishing["stop_reason"] = "</answer>"
    later = delta(finish=None)  # a later frame with a null finish_reason
    later["stop_reason"] = None
    result = assemble(
        [
            chunk(finishing),
            chunk(later),
            chunk(usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}),
        ]
    )
    choice = result["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == "</answer>"


def test_stop_reason_token_id() -> None:
    last = delta(finish="stop")
    last["stop_reason"] = 151645
    assert assemble([chunk(last)])["choices"][0]["stop_reason"] == 151645


def test_stop_reason_absent_when_the_engine_never_sent_it() -> None:
    # llama.cpp, transformers and OpenAI have no stop_reason (PROTOCOL.md §6.4).
    assert "stop_reason" not in assemble([chunk(delta(finish="stop"))])["choices"][0]


def test_choice_without_finish_reason_is_a_truncated_stream() -> None:
    with pytest.raises(EngineOutputError, match="before choice 0 finished"):
        assemble([chunk(delta(content="a")), chunk(usage={"prompt_tokens": 1})])


def test_stream_without_choices_is_a_502() -> None:
    with pytest.raises(EngineOutputError, match="without any choice"):
        assemble([chunk(usage={"prompt_tokens": 1})])


# --- Usage --------------------------------------------------------------------------


def test_engine_usage_kept_as_is() -> None:
    usage = {
        "prompt_tokens": 3,
        "total_tokens": 9,
        "completion_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": None,
    }
    result = assemble([chunk(delta(finish="stop"), usage=None), chunk(usage=dict(usage))])
    assert result["usage"] == usage


def test_last_engine_usage_wins() -> None:
    # Continuous stats are cumulative; the usage-only chunk has the total (§2.2).
    result = assemble(
        [
            chunk(delta(content="a"), usage={"prompt_tokens": 3, "completion_tokens": 1}),
            chunk(delta(finish="stop"), usage={"prompt_tokens": 3, "completion_tokens": 2}),
            chunk(usage=None),
        ]
    )
    assert result["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}


def test_usage_on_the_finishing_chunk() -> None:
    usage = {"completion_tokens": 12, "prompt_tokens": 20, "total_tokens": 32}
    assert assemble([chunk(delta(finish="stop"), usage=usage)])["usage"] == usage


def test_usage_computed_when_the_engine_sent_none() -> None:
    result = assemble(
        [chunk(delta(content="a"), usage=None), chunk(delta(finish="stop"))],
        prompt_tokens=11,
        completion_tokens=4,
    )
    assert result["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}


# --- Token IDs ----------------------------------------------------------------------


def test_chat_token_ids_exposed() -> None:
    role = chunk(delta(role="assistant", content=""), prompt_token_ids=[1, 2, 3])
    a, b, c = delta(content="a"), delta(), delta(content="b", finish="stop")
    a["token_ids"], b["token_ids"], c["token_ids"] = [10], [11, 12], [13]
    result = assemble([role, chunk(a), chunk(b), chunk(c)], exposure=IDS)
    assert result["prompt_token_ids"] == [1, 2, 3]
    assert result["choices"][0]["token_ids"] == [10, 11, 12, 13]
    assert "prompt_token_ids" not in result["choices"][0]


def test_chat_token_ids_hidden() -> None:
    role = chunk(delta(role="assistant", content=""), prompt_token_ids=[1, 2, 3])
    a = delta(content="a", finish="stop")
    a["token_ids"] = [10]
    result = assemble([role, chunk(a)], exposure=NO_IDS)
    assert "prompt_token_ids" not in result
    assert "token_ids" not in result["choices"][0]


def test_chat_token_ids_exposed_but_never_sent_are_null() -> None:
    result = assemble([chunk(delta(content="a", finish="stop"))], exposure=IDS)
    assert result["prompt_token_ids"] is None
    assert result["choices"][0]["token_ids"] is None


def test_completion_token_ids_exposed_per_choice() -> None:
    events = [
        chunk(text(" Paris", prompt_token_ids=[791, 6864], token_ids=[12366])),
        chunk(text(".", finish="stop", prompt_token_ids=None, token_ids=[13])),
    ]
    choice = assemble(events, route="completion", exposure=IDS)["choices"][0]
    assert choice["prompt_token_ids"] == [791, 6864]
    assert choice["token_ids"] == [12366, 13]
    hidden = assemble(events, route="completion", exposure=NO_IDS)
    assert "prompt_token_ids" not in hidden["choices"][0]
    assert "token_ids" not in hidden["choices"][0]
    assert "prompt_token_ids" not in hidden


def test_sglext_ids_become_the_same_fields_as_vllms_only_with_token_ids() -> None:
    """SGLang gives a streamed chat's IDs in one sglext chunk at the end (PROTOCOL.md
    §6.1): a client that asked for IDs gets them where a vLLM engine's would be."""
    sglext = {"input_ids": [1, 5], "output_ids": [[2, 3], [4]]}
    events = [
        chunk(delta(0, content="a", finish="stop")),
        chunk(delta(1, content="b", finish="stop")),
        chunk(sglext=sglext, usage=None),
    ]
    result = assemble(events, exposure=IDS)
    assert result["prompt_token_ids"] == [1, 5]
    assert [c["token_ids"] for c in result["choices"]] == [[2, 3], [4]]
    assert "sglext" not in result
    hidden = assemble(events, exposure=NO_IDS)
    assert "sglext" not in hidden and "prompt_token_ids" not in hidden
    assert all("token_ids" not in c for c in hidden["choices"])


@pytest.mark.parametrize(
    "sglext",
    [[1], {"output_ids": [[True]]}, {"output_ids": [2]}, {"output_ids": {"0": [1]}},
     {"input_ids": [-1]}],
)  # fmt: skip
def test_malformed_sglext_ids_are_a_502(sglext: Any) -> None:
    events = [chunk(delta(content="a", finish="stop")), chunk(sglext=sglext)]
    with pytest.raises(EngineOutputError):
        assemble(events, exposure=IDS)


# --- Several choices, repeat calls --------------------------------------------------


def test_interleaved_choices_returned_in_index_order() -> None:
    result = assemble(
        [
            chunk(delta(1, content="B")),
            chunk(delta(0, content="A")),
            chunk(delta(1, content="b", finish="length")),
            chunk(delta(0, content="a", finish="stop")),
        ]
    )
    assert [
        (c["index"], c["message"]["content"], c["finish_reason"]) for c in result["choices"]
    ] == [
        (0, "Aa", "stop"),
        (1, "Bb", "length"),
    ]


def test_result_can_be_called_twice() -> None:
    assembler = Assembler("chat", NO_IDS)
    assembler.add(chunk(delta(content="a", finish="stop")))
    first = assembler.result(prompt_tokens=1, completion_tokens=1)
    assert assembler.result(prompt_tokens=1, completion_tokens=1) == first


def test_logprobs_key_only_when_the_engine_writes_it() -> None:
    # vLLM and SGLang write `"logprobs": null` on every choice; transformers serve leaves
    # nulls out, and its own answer has no logprobs key either.
    with_null = assemble([chunk(delta(role="assistant", content="a", finish="stop"))])
    assert with_null["choices"][0]["logprobs"] is None
    bare = {"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}
    assert "logprobs" not in assemble([chunk(bare)])["choices"][0]


def test_vllm_answers_a_client_without_ids_with_null_id_lists() -> None:
    # vLLM's own non-streaming answer to such a client has them, null (PROTOCOL.md §1.2).
    vllm = Exposure(token_ids=False, usage=True, continuous_usage=False, null_ids=True)
    done_chat = {"index": 0, "delta": {"content": "a"}, "finish_reason": "stop", "token_ids": [4]}
    chat = assemble([chunk(done_chat)], exposure=vllm)
    assert chat["choices"][0]["token_ids"] is None and chat["prompt_token_ids"] is None
    done = text("a", finish="length", token_ids=[5], prompt_token_ids=None)
    completion = assemble([chunk(done)], route="completion", exposure=vllm)
    assert completion["choices"][0]["token_ids"] is None
    assert completion["choices"][0]["prompt_token_ids"] is None
    assert "prompt_token_ids" not in completion
    # SGLang leaves them out, and so does its assembled answer.
    assert "token_ids" not in assemble([chunk(delta(content="a", finish="stop"))])["choices"][0]

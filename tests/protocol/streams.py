"""Recorded-style engine streams, written from PROTOCOL.md (not captures).

Each stream is the exact bytes an engine writes on the wire, together with what the
assembler must make of it. Keys, null fields and chunk order follow the sections
cited on each stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Route = Literal["chat", "completion"]


@dataclass(frozen=True)
class Stream:
    name: str
    route: Route
    body: bytes
    token_ids: bool  # the engine sends per-event token IDs on this route
    output_ids: int  # generated IDs in the stream (0 without token IDs)
    events: int  # SSE events in the stream, [DONE] included
    done: bool  # ends with data: [DONE]


def _sse(*lines: str, keep_alive_after: int | None = None) -> bytes:
    out = []
    for i, line in enumerate(lines):
        out.append(b"data: " + line.encode() + b"\n\n")
        if keep_alive_after == i:
            out.append(b": keep-alive\n\n")
    return b"".join(out)


# vLLM 0.33 chat (PROTOCOL.md §1.2, §2.1, §2.2): role chunk with top-level
# prompt_token_ids, content chunks with per-choice token_ids and kv_transfer_params
# null, an empty delta that still carries IDs (0.13+), the finishing chunk with
# stop_reason/weight_versions and kv_transfer_params, the usage-only chunk, [DONE],
# and a keep-alive comment (--sse-keep-alive-interval, §2.1).
VLLM_CHAT = Stream(
    "vllm_chat",
    "chat",
    _sse(
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        '"finish_reason":null}],"prompt_token_ids":[151644,872,198],"prompt_text":null}',
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,'
        '"token_ids":[13048]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,'
        '"token_ids":[11]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":" th\\u00e9re \\ud83d\\udc4b"},"logprobs":null,'
        '"finish_reason":null,"token_ids":[1052,220,9468]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop",'
        '"stop_reason":null,"token_ids":[0],"weight_versions":null}],'
        '"system_fingerprint":"vllm-0.33.0-abc",'
        '"kv_transfer_params":{"do_remote_prefill":false,"remote_block_ids":[[1,2]]}}',
        '{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",'
        '"choices":[],"usage":{"prompt_tokens":3,"total_tokens":9,"completion_tokens":6},'
        '"system_fingerprint":"vllm-0.33.0-abc"}',
        "[DONE]",
        keep_alive_after=1,
    ),
    token_ids=True,
    output_ids=6,
    events=7,
    done=True,
)

VLLM_CHAT_RESULT: dict[str, Any] = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi th\u00e9re \U0001f44b!"},
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
            "weight_versions": None,
        }
    ],
    "prompt_text": None,
    "kv_transfer_params": {"do_remote_prefill": False, "remote_block_ids": [[1, 2]]},
    "system_fingerprint": "vllm-0.33.0-abc",
    "usage": {"prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6},
}

# vLLM tool call (PROTOCOL.md §2.2 DeltaToolCall): id, type and name on the first
# fragment with no arguments key, argument fragments later, the last fragment on the
# finishing chunk, finish_reason tool_calls.
VLLM_CHAT_TOOLS = Stream(
    "vllm_chat_tools",
    "chat",
    _sse(
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        '"finish_reason":null}],"prompt_token_ids":[1,2,3,4],"prompt_text":null}',
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,'
        '"token_ids":[151657]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-9f","type":"function",'
        '"index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,'
        '"token_ids":[633,28945]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        '{"arguments":"{\\"city\\": \\"Par"}}]},"logprobs":null,"finish_reason":null,'
        '"token_ids":[5765,794,330,3119]}],"kv_transfer_params":null}',
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
        '{"arguments":"is\\"}"}}]},"logprobs":null,"finish_reason":"tool_calls",'
        '"stop_reason":null,"token_ids":[285,9207,151658],"weight_versions":null}],'
        '"kv_transfer_params":null}',
        '{"id":"chatcmpl-t","object":"chat.completion.chunk","created":1700000001,"model":"m",'
        '"choices":[],"usage":{"prompt_tokens":4,"total_tokens":14,"completion_tokens":10}}',
        "[DONE]",
    ),
    token_ids=True,
    output_ids=10,
    events=7,
    done=True,
)

# vLLM 0.11.1 to 0.15.1 (PROTOCOL.md §2.2): reasoning and reasoning_content on every
# delta (the deprecated one copied, null included), chat logprobs (§2.2 shape).
VLLM_CHAT_REASONING_015 = Stream(
    "vllm_chat_reasoning_015",
    "chat",
    _sse(
        '{"id":"chatcmpl-r","object":"chat.completion.chunk","created":1700000002,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":null,'
        '"reasoning_content":null},"logprobs":null,"finish_reason":null}],'
        '"prompt_token_ids":[7,8]}',
        '{"id":"chatcmpl-r","object":"chat.completion.chunk","created":1700000002,"model":"m",'
        '"choices":[{"index":0,"delta":{"reasoning":"Think","reasoning_content":"Think"},'
        '"logprobs":{"content":[{"token":"Think","logprob":-0.1,"bytes":[84,104,105,110,107],'
        '"top_logprobs":[]}]},"finish_reason":null,"token_ids":[38687]}]}',
        '{"id":"chatcmpl-r","object":"chat.completion.chunk","created":1700000002,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":"Yes","reasoning_content":null},'
        '"logprobs":{"content":[{"token":"Yes","logprob":-0.5,"bytes":[89,101,115],'
        '"top_logprobs":[]}]},"finish_reason":null,"token_ids":[9454]}]}',
        '{"id":"chatcmpl-r","object":"chat.completion.chunk","created":1700000002,"model":"m",'
        '"choices":[{"index":0,"delta":{"content":".","reasoning_content":null},'
        '"logprobs":{"content":[{"token":".","logprob":-9999.0,"bytes":[46],"top_logprobs":[]}]},'
        '"finish_reason":"length","stop_reason":null,"token_ids":[13]}]}',
        "[DONE]",
    ),
    token_ids=True,
    output_ids=3,
    events=5,
    done=True,
)

# vLLM completions (PROTOCOL.md §1.3, §2.3): IDs per choice, prompt IDs with the first
# text, legacy logprobs with text_offset counting across chunks, explicit nulls,
# stop_reason a stop string, the usage-only chunk.
VLLM_COMPLETION = Stream(
    "vllm_completion",
    "completion",
    _sse(
        '{"id":"cmpl-abc","object":"text_completion","created":1700000003,"model":"m",'
        '"choices":[{"index":0,"text":" Paris","logprobs":{"text_offset":[0],'
        '"token_logprobs":[-0.2],"tokens":[" Paris"],"top_logprobs":[{" Paris":-0.2}]},'
        '"finish_reason":null,"stop_reason":null,"prompt_token_ids":[791,6864,315],'
        '"token_ids":[12366],"weight_versions":null}],"kv_transfer_params":null}',
        '{"id":"cmpl-abc","object":"text_completion","created":1700000003,"model":"m",'
        '"choices":[{"index":0,"text":".","logprobs":{"text_offset":[6],'
        '"token_logprobs":[-1.5],"tokens":["."],"top_logprobs":[{".":-1.5}]},'
        '"finish_reason":"stop","stop_reason":"\\n\\n","prompt_token_ids":null,'
        '"token_ids":[13],"weight_versions":null}],"kv_transfer_params":null}',
        '{"id":"cmpl-abc","object":"text_completion","created":1700000003,"model":"m",'
        '"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}',
        "[DONE]",
    ),
    token_ids=True,
    output_ids=2,
    events=4,
    done=True,
)

VLLM_COMPLETION_RESULT: dict[str, Any] = {
    "id": "cmpl-abc",
    "object": "text_completion",
    "created": 1700000003,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "text": " Paris.",
            "logprobs": {
                "text_offset": [0, 6],
                "token_logprobs": [-0.2, -1.5],
                "tokens": [" Paris", "."],
                "top_logprobs": [{" Paris": -0.2}, {".": -1.5}],
            },
            "finish_reason": "stop",
            "stop_reason": "\n\n",
            "weight_versions": None,
        }
    ],
    "kv_transfer_params": None,
    "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2},
}

# SGLang 0.5.23 chat (PROTOCOL.md §6.1): plain model_dump_json (nulls present),
# reasoning_content, matched_stop, no per-event IDs, the framed sglext ID chunk before
# the usage chunk, [DONE].
SGLANG_CHAT = Stream(
    "sglang_chat",
    "chat",
    _sse(
        '{"id":"s1","object":"chat.completion.chunk","created":1700000004,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,'
        '"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],'
        '"usage":null}',
        '{"id":"s1","object":"chat.completion.chunk","created":1700000004,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":"hmm",'
        '"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],'
        '"usage":null}',
        '{"id":"s1","object":"chat.completion.chunk","created":1700000004,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":null,"content":"ok","reasoning_content":null,'
        '"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],'
        '"usage":null}',
        '{"id":"s1","object":"chat.completion.chunk","created":1700000004,"model":"m",'
        '"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,'
        '"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":151645}],'
        '"usage":null}',
    )
    + b'event: sglext_ids\ndata: {"id":"s1","object":"chat.completion.chunk",'
    b'"created":1700000004,"model":"m","choices":[],'
    b'"sglext":{"input_ids":[1,2],"output_ids":[[5,6,7]]}}\n\n'
    + _sse(
        '{"id":"s1","object":"chat.completion.chunk","created":1700000004,"model":"m",'
        '"choices":[],"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3}}',
        "[DONE]",
    ),
    token_ids=False,
    output_ids=0,
    events=7,
    done=True,
)

# SGLang completions with return_token_ids (0.5.17+, PROTOCOL.md §6.1): IDs per choice,
# unset ID keys left out.
SGLANG_COMPLETION = Stream(
    "sglang_completion",
    "completion",
    _sse(
        '{"id":"s2","object":"text_completion","created":1700000005,"model":"m",'
        '"choices":[{"index":0,"text":"4","logprobs":null,"finish_reason":null,'
        '"matched_stop":null,"prompt_token_ids":[17,10,17,28],"token_ids":[19]}],"usage":null}',
        '{"id":"s2","object":"text_completion","created":1700000005,"model":"m",'
        '"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length",'
        '"matched_stop":null,"token_ids":[198]}],"usage":null}',
        '{"id":"s2","object":"text_completion","created":1700000005,"model":"m",'
        '"choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}',
        "[DONE]",
    ),
    token_ids=True,
    output_ids=2,
    events=4,
    done=True,
)

# llama.cpp (PROTOCOL.md §6.2): role chunk with content null, reasoning_content,
# tool calls with a 32-character id, finishing chunk with delta {} and timings,
# usage-only chunk, [DONE]. No token IDs.
LLAMACPP_CHAT = Stream(
    "llamacpp_chat",
    "chat",
    _sse(
        '{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],'
        '"created":1700000006,"id":"chatcmpl-l","model":"m","system_fingerprint":"b6000-abc",'
        '"object":"chat.completion.chunk"}',
        '{"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"Plan"}}],'
        '"created":1700000006,"id":"chatcmpl-l","model":"m","system_fingerprint":"b6000-abc",'
        '"object":"chat.completion.chunk"}',
        '{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,'
        '"id":"aBcDeFgHiJkLmNoPqRsTuVwXyZ012345","type":"function","function":'
        '{"name":"lookup","arguments":"{\\"q\\":"}}]}}],"created":1700000006,"id":"chatcmpl-l",'
        '"model":"m","system_fingerprint":"b6000-abc","object":"chat.completion.chunk"}',
        '{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,'
        '"function":{"arguments":"\\"x\\"}"}}]}}],"created":1700000006,"id":"chatcmpl-l",'
        '"model":"m","system_fingerprint":"b6000-abc","object":"chat.completion.chunk"}',
        '{"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"created":1700000006,'
        '"id":"chatcmpl-l","model":"m","system_fingerprint":"b6000-abc",'
        '"object":"chat.completion.chunk","timings":{"predicted_n":9,"prompt_n":5}}',
        '{"choices":[],"created":1700000006,"id":"chatcmpl-l","model":"m",'
        '"system_fingerprint":"b6000-abc","object":"chat.completion.chunk",'
        '"usage":{"completion_tokens":9,"prompt_tokens":5,"total_tokens":14}}',
        "[DONE]",
    ),
    token_ids=False,
    output_ids=0,
    events=7,
    done=True,
)

# transformers serve 5.24 (PROTOCOL.md §6.3): exclude_none chunks, role chunk without
# content, each tool call whole, usage on the finishing chunk (choices not empty), no
# [DONE].
TRANSFORMERS_CHAT = Stream(
    "transformers_chat",
    "chat",
    _sse(
        '{"id":"req_1","choices":[{"delta":{"role":"assistant"},"index":0}],'
        '"created":1700000007,"model":"m","object":"chat.completion.chunk",'
        '"system_fingerprint":""}',
        '{"id":"req_1","choices":[{"delta":{"content":"Calling"},"index":0}],'
        '"created":1700000007,"model":"m","object":"chat.completion.chunk",'
        '"system_fingerprint":""}',
        '{"id":"req_1","choices":[{"delta":{"tool_calls":[{"function":{"arguments":'
        '"{\\"a\\": 1}","name":"f"},"id":"req_1_tool_call_0","type":"function","index":0}]},'
        '"index":0}],"created":1700000007,"model":"m","object":"chat.completion.chunk",'
        '"system_fingerprint":""}',
        '{"id":"req_1","choices":[{"delta":{},"finish_reason":"tool_calls","index":0}],'
        '"created":1700000007,"model":"m","object":"chat.completion.chunk",'
        '"system_fingerprint":"","usage":{"completion_tokens":12,"prompt_tokens":20,'
        '"total_tokens":32}}',
    ),
    token_ids=False,
    output_ids=0,
    events=4,
    done=False,
)

ALL = (
    VLLM_CHAT,
    VLLM_CHAT_TOOLS,
    VLLM_CHAT_REASONING_015,
    VLLM_COMPLETION,
    SGLANG_CHAT,
    SGLANG_COMPLETION,
    LLAMACPP_CHAT,
    TRANSFORMERS_CHAT,
)


def with_line_ends(body: bytes, end: bytes) -> bytes:
    """The same stream with CRLF or CR line ends (the JSON has no raw newlines)."""
    return body.replace(b"\n", end)

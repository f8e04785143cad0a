"""The byte-level fast path agrees with the full path, or declines."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.errors import UpstreamError
from narwhal.protocol.exposure import Exposed, Exposure, apply_exposure
from narwhal.protocol.fastscan import scan_chunk, strip_id_lists
from narwhal.protocol.tokens import count_event_token_ids

CONTENT = (
    b'{"id":"chatcmpl-a","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":[13048,7]}],"kv_transfer_params":null}'
)
COMPLETION = (
    b'{"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":null,"token_ids":[12366],"weight_versions":null}],'
    b'"kv_transfer_params":null}'
)


def test_plain_chunks_are_scanned() -> None:
    assert scan_chunk(CONTENT) == 2
    assert scan_chunk(COMPLETION) == 1
    assert scan_chunk(CONTENT.replace(b"[13048,7]", b"[]")) == 0


@pytest.mark.parametrize(
    "data",
    [
        CONTENT.replace(b"[13048,7]", b"[true]"),
        CONTENT.replace(b"[13048,7]", b"[-1]"),
        CONTENT.replace(b"[13048,7]", b"[1.0]"),
        CONTENT.replace(b"[13048,7]", b"[01]"),
        CONTENT.replace(b"[13048,7]", b"[1, 2]"),
        CONTENT.replace(b"[13048,7]", b'"13048"'),
        CONTENT.replace(b"[13048,7]", b"null"),
        CONTENT.replace(b"[13048,7]", b"[[1]]"),
        CONTENT.replace(b'"finish_reason":null', b'"finish_reason":"stop"'),
        CONTENT.replace(b',"token_ids":[13048,7]', b""),
        CONTENT[:-1] + b',"usage":{"prompt_tokens":1}}',
        CONTENT[:-1] + b',"error":null}',
        CONTENT[:-1] + b',"prompt_token_ids":[1,2]}',
        CONTENT.replace(b"}]", b'},{"index":1,"delta":{},"finish_reason":null,"token_ids":[1]}]'),
        CONTENT[:-1],
        b"[DONE]",
    ],
)
def test_anything_else_is_declined(data: bytes) -> None:
    assert scan_chunk(data) is None


def test_keys_inside_generated_text_do_not_confuse_it() -> None:
    text = json.dumps('say "token_ids":[1] and "usage": "finish_reason":"stop"').encode()
    data = CONTENT.replace(b'" Hi"', text)
    assert scan_chunk(data) == 2
    stripped = json.loads(strip_id_lists(data))
    assert stripped["choices"][0]["delta"]["content"] == json.loads(text)


@pytest.mark.parametrize("data", [CONTENT, COMPLETION])
def test_stripping_matches_the_exposure_filter(data: bytes) -> None:
    event = msgspec.json.decode(data)
    assert apply_exposure(event, Exposure(False, False, False)) is Exposed.CHANGED
    assert json.loads(strip_id_lists(data)) == event


ids = st.lists(st.integers(0, 2**31), max_size=6)
texts = st.text(max_size=20)
choice_extras = st.dictionaries(
    st.sampled_from(["logprobs", "stop_reason", "weight_versions", "prompt_token_ids"]),
    st.none(),
    max_size=4,
)
any_ids: Any = st.one_of(
    ids, st.none(), st.lists(st.one_of(st.booleans(), st.integers(-3, 3), st.floats()), max_size=3)
)


@settings(max_examples=400, deadline=None)
@given(
    text=texts,
    token_ids=any_ids,
    extras=choice_extras,
    finish=st.sampled_from([None, "stop", "length"]),
    chat=st.booleans(),
)
def test_fast_path_never_disagrees_with_the_full_path(
    text: str, token_ids: Any, extras: dict[str, None], finish: str | None, chat: bool
) -> None:
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    choice.update(extras)
    choice["finish_reason"] = finish
    choice["token_ids"] = token_ids
    event = {"id": "x", "choices": [choice], "kv_transfer_params": None}
    data = msgspec.json.encode(event)
    fast = scan_chunk(data)
    if fast is None:
        return
    assert finish is None
    assert fast == count_event_token_ids(
        msgspec.json.decode(data), "chat" if chat else "completion"
    )
    exposed = msgspec.json.decode(data)
    apply_exposure(exposed, Exposure(False, False, False))
    assert json.loads(strip_id_lists(data)) == exposed


def test_full_path_rejects_what_fast_path_declines() -> None:
    with pytest.raises(UpstreamError):
        count_event_token_ids(msgspec.json.decode(CONTENT.replace(b"[13048,7]", b"[true]")), "chat")

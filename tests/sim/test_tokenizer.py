"""The deterministic tokenizer shared by the sim and the router."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import narwhal.protocol.tokenizer as tokenizer_module
from narwhal.protocol.tokenizer import (
    BOS_ID,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    SimTokenizer,
)

TOK = SimTokenizer()
PROSE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity."
)


def test_ids_are_pinned() -> None:
    # These ids are part of the contract: the router sizes prompts with them.
    assert TOK.encode("Hello, world! 42 times.\n") == [
        15779750, 49428767, 35445010, 49428756, 49427698, 33910242, 49428769, 49430868
    ]  # fmt: skip


def test_same_ids_in_another_process() -> None:
    code = "from narwhal.protocol.tokenizer import SimTokenizer as T; print(T().encode(%r))"
    out = subprocess.run(
        [sys.executable, "-c", code % PROSE], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(TOK.encode(PROSE))


@given(st.text(max_size=200))
def test_round_trip_and_count(text: str) -> None:
    ids = TOK.encode(text)
    assert TOK.decode(ids) == text
    assert TOK.count(text) == len(ids)
    assert all(0 <= i < TOK.vocab_size for i in ids)


def test_english_is_word_ish() -> None:
    chars_per_token = len(PROSE) / TOK.count(PROSE)
    assert 3.0 < chars_per_token < 5.0


def test_chat_template() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    ids = TOK.chat_prompt_ids(messages)
    assert ids.count(IM_START_ID) == 4 and ids.count(IM_END_ID) == 3
    assert ids[-4:] == [IM_START_ID, *TOK.encode("assistant\n")]
    assert TOK.chat_prompt_count(messages) == len(ids)
    assert "Hi" in TOK.decode(ids) and "Be brief." in TOK.decode(ids)
    assert TOK.chat_prompt_ids([{"role": "user", "content": "Hi"}]) == [
        3, 9518108, 49430868, 15683440, 4, 3, 347057, 9030921, 49430868
    ]  # fmt: skip


def test_completion_prompt_ids() -> None:
    assert TOK.completion_prompt_ids("Hi") == [BOS_ID, *TOK.encode("Hi")]
    assert TOK.completion_prompt_ids([7, 8, 9]) == [7, 8, 9]
    assert TOK.completion_prompt_ids(()) == []


def test_special_tokens_decode_to_markers() -> None:
    assert TOK.token_text(EOS_ID) == "<|eos|>"
    assert TOK.decode([IM_START_ID]) == "<|im_start|>"


def test_module_is_sans_io() -> None:
    tree = ast.parse(Path(tokenizer_module.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"asyncio", "aiohttp", "socket", "selectors", "ssl"}

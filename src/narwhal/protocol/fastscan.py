"""A byte-level fast path for the common vLLM stream chunk (sans-IO).

Nearly every event of a vLLM stream is one choice with a few new tokens:

    {"id":..,"choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,
     "finish_reason":null,"token_ids":[13048]}],"kv_transfer_params":null}

For such an event the token-ID check needs only the `token_ids` list, and the exposure
rules only remove the ID lists. Both are done here on the bytes, with a handful of
C-level searches, instead of decoding the JSON into dicts and encoding it again — the
largest per-event cost of the relay. Anything else (the role chunk with prompt IDs, the
finishing chunk, usage, errors, several choices, IDs that are not plain digits) is
declined, and the caller takes the full path (`events.decode_event` and friends), so the
fast path never decides anything the full path would decide differently.

Why searching for a quoted key is sound: inside a JSON string every `"` is escaped, so
the bytes `"token_ids":` can only ever be an object key, never part of generated text.
"""

from __future__ import annotations

import re
from typing import Final

_TOKEN_IDS: Final = b'"token_ids":'
_PROMPT_IDS: Final = b'"prompt_token_ids":'
_FINISH: Final = b'"finish_reason":'
_DECLINE_KEYS: Final = (b'"error":', b'"usage":', b'"sglext":')
# A JSON array of nonnegative integers, exactly as engines write it (no spaces).
_PLAIN_IDS: Final = re.compile(rb"\[(?:(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*)?\]")
_NULL: Final = b"null"


def scan_chunk(data: bytes) -> int | None:
    """Generated token IDs in a plain one-choice, unfinished chunk; None to decline.

    A non-None answer means: the event is a JSON object with exactly one choice, that
    choice has not finished, it carries a valid `token_ids` list of that many IDs, and
    there is no usage, error or prompt-ID list to look at.
    """
    if data[:1] != b"{" or data[-1:] != b"}":
        return None
    start = data.find(_TOKEN_IDS)
    if start < 0 or data.find(_TOKEN_IDS, start + 12) >= 0:
        return None
    finish = data.find(_FINISH)
    if finish < 0 or data.find(_FINISH, finish + 16) >= 0:
        return None
    if data[finish + 16 : finish + 20] != _NULL:
        return None
    for key in _DECLINE_KEYS:
        if key in data:
            return None
    prompt = data.find(_PROMPT_IDS)
    if prompt >= 0 and data[prompt + 19 : prompt + 23] != _NULL:
        return None
    ids_start = start + 12
    ids_end = data.find(b"]", ids_start) + 1
    if not ids_end or _PLAIN_IDS.fullmatch(data, ids_start, ids_end) is None:
        return None
    if ids_end == ids_start + 2:
        return 0
    return data.count(b",", ids_start, ids_end) + 1


def strip_id_lists(raw: bytes) -> bytes:
    """The event without its `token_ids` and `prompt_token_ids` keys (a scanned chunk's).

    Only for events `scan_chunk` accepted: their ID values are a flat list or null.
    """
    for key in (_TOKEN_IDS, _PROMPT_IDS):
        start = raw.find(key)
        if start < 0:
            continue
        value = start + len(key)
        end = value + 4 if raw[value : value + 4] == _NULL else raw.find(b"]", value) + 1
        if raw[start - 1 : start] == b",":
            raw = raw[: start - 1] + raw[end:]
        elif raw[end : end + 1] == b",":
            raw = raw[:start] + raw[end + 1 :]
        else:
            raw = raw[:start] + raw[end:]
    return raw

"""Non-streaming assembly: one final response from the engine's stream.

Seed, "Non-streaming assembly": "For non-streaming clients, Narwhal consumes the
engine stream and assembles one final response." Each row of the seed's table has
its place here:

    Chat content / reasoning / reasoning_content / refusal   _ChatChoice._output
    tool_calls, legacy function_call                         toolcalls.py
    Chat and text-completion logprobs                        logprobs.py
    "returns HTTP 502 for unsupported … fields"              fields.py allow-lists
    response metadata, non-null engine usage                 Assembler.add
    finish_reason, optional stop_reason, surviving
      later usage-only frames                                _Choice._common
    usage computed when the engine omits it                  Assembler.result

The caller decodes each event once, validates its token IDs (tokens.py; the count
it gets there is the measured output length for `result`) and hands the dict to
`add`. Nothing here does I/O; `result` may be called more than once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from narwhal.protocol.echo import restore_echo
from narwhal.protocol.events import EngineOutputError, Route, raise_for_engine_error
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.fields import (
    CHOICE_METADATA,
    COMPLETION_CHOICE_METADATA,
    DELTA_OUTPUT,
    DELTA_TEXT,
    TOP_LEVEL_DROPPED,
    expect_str,
    is_empty,
    malformed,
    unexpected_choice,
    unsupported,
)
from narwhal.protocol.logprobs import Logprobs
from narwhal.protocol.shape import check_event
from narwhal.protocol.tokens import check_token_ids, sglext_output_ids
from narwhal.protocol.toolcalls import FunctionCall, ToolCalls
from narwhal.protocol.usage import computed_usage, event_usage

# What one answer may be assembled from by default (`fleet.max_response_bytes`).
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 << 20
_OBJECT: Final = {"chat": "chat.completion", "completion": "text_completion"}
# Identification first, as OpenAI and vLLM order their responses.
_HEAD: Final = ("id", "object", "created", "model")
# Top-level keys that are not plain metadata: the dropped ones, and the ID lists that
# only a client asking for token IDs sees (`_take_ids`).
_NOT_METADATA: Final = TOP_LEVEL_DROPPED | {"prompt_token_ids", "sglext"}
_DELTA_TEXT: Final = frozenset(DELTA_TEXT)
# The message fields a delta may send as null (the role never is).
_MESSAGE_FIELDS: Final = frozenset(DELTA_OUTPUT)


class ResponseTooLarge(EngineOutputError):
    """The events of one non-streaming answer passed the size it may be assembled from."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"engine's answer is longer than fleet.max_response_bytes ({limit} bytes of "
            "events); a streaming request has no such bound"
        )
        self.limit = limit


class _Choice:
    """What one choice index accumulated; the route-specific part is in subclasses."""

    __slots__ = (
        "finish_reason",
        "has_logprobs",
        "has_stop_reason",
        "index",
        "keep_ids",
        "logprobs",
        "metadata",
        "prompt_token_ids",
        "stop_reason",
        "token_ids",
    )
    metadata_keys: frozenset[str] = CHOICE_METADATA
    output_key: str  # "delta" or "text"

    def __init__(self, index: int, route: Route, keep_ids: bool) -> None:
        self.index = index
        self.keep_ids = keep_ids
        self.logprobs = Logprobs(route)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.has_stop_reason = False
        self.has_logprobs = False  # the engine writes the key (vLLM, SGLang: null if unset)
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.metadata: dict[str, Any] = {}

    def add(self, choice: dict[str, Any]) -> None:
        """One chunk's choice object. The keys of a vLLM content chunk are decided
        inline; everything else goes through `_common`."""
        output_key = self.output_key
        for key, value in choice.items():
            if key == output_key:
                if value is not None:
                    self._output(value)
            elif value is None:
                # null is "not sent" (PROTOCOL.md §1.2), but a null stop_reason, logprobs
                # or metadata key still tells that the engine has the field.
                if key == "stop_reason" or key == "logprobs" or key in self.metadata_keys:
                    self._common(key, value)
            elif key != "index" and (key != "token_ids" or self.keep_ids):
                self._common(key, value)

    def _output(self, value: Any) -> None:
        raise NotImplementedError

    def _common(self, key: str, value: Any) -> None:
        """A choice key shared by both routes."""
        if key == "logprobs":
            self.has_logprobs = True
            if value is not None:
                self.logprobs.add(value)
        elif key == "finish_reason":
            # A later chunk's null (e.g. before a usage-only frame) never erases it.
            if value is not None:
                self.finish_reason = expect_str(value, "finish_reason")
        elif key == "token_ids":
            if self.keep_ids and value is not None:
                check_token_ids(value, "token_ids")
                if self.token_ids is None:
                    self.token_ids = list(value)
                else:
                    self.token_ids.extend(value)
        elif key == "stop_reason":
            self.has_stop_reason = True
            if value is not None:
                # PROTOCOL.md §2.2: the stop token id or the stop string.
                if type(value) is not int and type(value) is not str:
                    malformed("stop_reason", "an integer or a string")
                self.stop_reason = value
        elif key == "prompt_token_ids":
            if self.keep_ids and value is not None and self.prompt_token_ids is None:
                check_token_ids(value, "prompt_token_ids")
                self.prompt_token_ids = value
        elif key in self.metadata_keys:
            if value is not None or key not in self.metadata:
                self.metadata[key] = value
        elif key != "index" and not is_empty(value):
            unsupported("choice", key)

    def _tail(self, out: dict[str, Any]) -> dict[str, Any]:
        if self.finish_reason is None:
            raise EngineOutputError(
                f"engine stream ended before choice {self.index} finished (no finish_reason)"
            )
        if self.has_logprobs:
            # (An engine that leaves nulls out, as transformers serve does, has no key.)
            out["logprobs"] = self.logprobs.result()
        out["finish_reason"] = self.finish_reason
        if self.has_stop_reason:
            out["stop_reason"] = self.stop_reason
        out.update(self.metadata)
        return out

    def result(self) -> dict[str, Any]:
        raise NotImplementedError


class _ChatChoice(_Choice):
    __slots__ = ("function_call", "nulls", "text", "tool_calls")
    output_key = "delta"

    def __init__(self, index: int, route: Route, keep_ids: bool) -> None:
        super().__init__(index, route, keep_ids)
        # content, reasoning, reasoning_content, refusal: their string fragments, each
        # under its own name (PROTOCOL.md "What follows": never merged).
        self.text: dict[str, list[str]] = {}
        self.tool_calls = ToolCalls()
        self.function_call = FunctionCall()
        # Message fields the deltas sent as null: the message keeps them, null, as the
        # engine's own answer does when it writes its nulls (SGLang, PROTOCOL.md §6.1).
        self.nulls: set[str] = set()

    def _output(self, delta: Any) -> None:
        if type(delta) is not dict:
            malformed("delta", "an object")
        text = self.text
        for key, value in delta.items():
            if value is None:
                # (vLLM 0.11.1 to 0.15.1 sends reasoning_content: null on every delta.)
                if key in _MESSAGE_FIELDS:
                    self.nulls.add(key)
                continue
            if key in _DELTA_TEXT:
                if type(value) is not str:
                    malformed(f"delta.{key}", "a string")
                fragments = text.get(key)
                if fragments is None:
                    text[key] = [value]
                else:
                    fragments.append(value)
            elif key == "tool_calls":
                self.tool_calls.add(value)
            elif key == "role":
                expect_str(value, "delta.role")
            elif key == "function_call":
                self.function_call.add(value)
            elif not is_empty(value):
                unsupported("delta", key)

    def result(self) -> dict[str, Any]:
        text = self.text
        content = text.get("content")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(content) if content is not None else None,
        }
        nulls = self.nulls
        for key in DELTA_TEXT[1:]:
            fragments = text.get(key)
            if fragments is not None:
                message[key] = "".join(fragments)
            elif key in nulls:
                message[key] = None
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls.result()
        elif "tool_calls" in nulls:
            message["tool_calls"] = None
        function_call = self.function_call.result()
        if function_call is not None or "function_call" in nulls:
            message["function_call"] = function_call
        if message["content"] == "" and (self.tool_calls or function_call is not None):
            # A call and no text: vLLM's own non-streaming answer has content null (its
            # tool parsers give None for empty text), as OpenAI's does; only the stream's
            # first delta carried `"content": ""`.
            message["content"] = None
        out = self._tail({"index": self.index, "message": message})
        if self.keep_ids:
            if self.prompt_token_ids is not None:
                out["prompt_token_ids"] = self.prompt_token_ids
            out["token_ids"] = self.token_ids
        return out


class _CompletionChoice(_Choice):
    __slots__ = ("text",)
    metadata_keys = COMPLETION_CHOICE_METADATA
    output_key = "text"

    def __init__(self, index: int, route: Route, keep_ids: bool) -> None:
        super().__init__(index, route, keep_ids)
        self.text: list[str] = []

    def _output(self, value: Any) -> None:
        if type(value) is not str:
            malformed("text", "a string")
        self.text.append(value)

    def result(self) -> dict[str, Any]:
        out = self._tail({"index": self.index, "text": "".join(self.text)})
        if self.keep_ids:
            out["prompt_token_ids"] = self.prompt_token_ids
            out["token_ids"] = self.token_ids
        return out


class Assembler:
    """Feed decoded engine events in stream order; `result` builds the response."""

    __slots__ = (
        "_asked",
        "_choice_type",
        "_choices",
        "_echo",
        "_keep_ids",
        "_metadata",
        "_null_ids",
        "_output_ids",
        "_prompt_ids",
        "_route",
        "_usage",
    )

    def __init__(self, route: Route, exposure: Exposure, *, choices: int | None = None) -> None:
        """`choices`: how many the engine was asked for (its `n`); an index past them is
        malformed output, and no state is built for it (None: any index)."""
        self._route: Route = route
        self._asked = choices
        self._keep_ids = exposure.token_ids
        self._echo = exposure.echo_text  # the echoed prompt text to put back (echo.py)
        # vLLM's own answer to a client without IDs has its ID lists, null.
        self._null_ids = exposure.null_ids and not exposure.token_ids
        self._choice_type = _ChatChoice if route == "chat" else _CompletionChoice
        self._choices: dict[int, _Choice] = {}
        self._metadata: dict[str, Any] = {}
        self._prompt_ids: list[int] | None = None
        self._output_ids: list[list[int]] | None = None  # SGLang's sglext.output_ids, per choice
        self._usage: dict[str, Any] | None = None

    def add(self, event: Mapping[str, Any]) -> None:
        """One decoded, token-ID-validated engine event. Raises UpstreamError (502) for
        an engine error event, an unsupported field with a value or a malformed one."""
        raise_for_engine_error(event)
        check_event(event, self._route)  # what is malformed: the same for a stream
        metadata = self._metadata
        for key, value in event.items():
            # Response metadata (id, created, model, system_fingerprint,
            # kv_transfer_params, …): a later null never erases a value, because vLLM
            # sets kv_transfer_params only on the finishing chunk (PROTOCOL.md §2.2).
            if key not in _NOT_METADATA and (value is not None or key not in metadata):
                metadata[key] = value
        if self._keep_ids:
            self._take_ids(event)
        usage = event_usage(event)
        if usage is not None:
            self._usage = usage  # the last one: continuous stats are cumulative
        choices = event.get("choices")
        if choices is None:
            return
        if type(choices) is not list:
            malformed("choices", "an array")
        if self._echo is not None:
            restore_echo(event, self._echo)
        for choice in choices:
            if type(choice) is not dict:
                malformed("choice", "an object")
            index = choice.get("index")
            if type(index) is not int or index < 0:
                malformed("choice index", "a nonnegative integer")
            if self._asked is not None and index >= self._asked:
                raise unexpected_choice(index, self._asked)
            state = self._choices.get(index)
            if state is None:
                state = self._choices[index] = self._choice_type(index, self._route, self._keep_ids)
            state.add(choice)

    def _take_ids(self, event: Mapping[str, Any]) -> None:
        """The top-level ID lists, kept only for a client that asked for them (the
        exposure rules): vLLM's prompt IDs (role chunk, §1.2) and SGLang's sglext (§6.1),
        whose lists become the same fields as vLLM's, so a client gets one shape."""
        prompt = event.get("prompt_token_ids")
        if prompt is not None and self._prompt_ids is None:
            check_token_ids(prompt, "prompt_token_ids")
            self._prompt_ids = prompt
        sglext = event.get("sglext")
        if sglext is None:
            return
        outputs = sglext_output_ids(event)  # (it checks that sglext is an object)
        inputs = sglext.get("input_ids")
        if inputs is not None and self._prompt_ids is None:
            check_token_ids(inputs, "sglext.input_ids")
            self._prompt_ids = inputs
        if outputs is not None:
            self._output_ids = outputs

    def result(self, *, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The assembled response. `prompt_tokens` and `completion_tokens` (Narwhal's
        sizing of the prompt and its validated output ID count) make the usage when the
        engine sent none. Raises UpstreamError for a truncated stream (a choice without
        a finish_reason, or no choice at all) and for an incomplete tool call."""
        if not self._choices:
            raise EngineOutputError("engine stream ended without any choice")
        choices = [self._choices[index].result() for index in sorted(self._choices)]
        if self._output_ids is not None:
            for choice in choices:
                if choice["index"] < len(self._output_ids):
                    choice["token_ids"] = self._output_ids[choice["index"]]
        metadata = self._metadata
        response: dict[str, Any] = {}
        for key in _HEAD:
            if key == "object":
                response[key] = _OBJECT[self._route]
            elif key in metadata:
                response[key] = metadata[key]
        response["choices"] = choices
        for key, value in metadata.items():
            if key not in response:
                response[key] = value
        usage = self._usage
        if usage is None:
            usage = computed_usage(prompt_tokens, completion_tokens)
        response["usage"] = usage
        if self._keep_ids and (self._route == "chat" or self._prompt_ids is not None):
            response["prompt_token_ids"] = self._prompt_ids
        elif self._null_ids:
            for choice in choices:
                if self._route == "completion":
                    choice["prompt_token_ids"] = None
                choice["token_ids"] = None
            if self._route == "chat":
                response["prompt_token_ids"] = None
        return response

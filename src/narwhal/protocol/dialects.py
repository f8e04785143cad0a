"""The engine dialects Narwhal speaks (sans-IO).

A dialect is how Narwhal talks to an engine (`engines[].dialect` in the configuration,
`narwhal sim --dialect`): vLLM first, SGLang second, any OpenAI-compatible server third
(DESIGN.md). The names are declared here once, for the router, the simulator and the
configuration alike.
"""

from __future__ import annotations

from typing import Literal

Dialect = Literal["vllm", "sglang", "openai"]

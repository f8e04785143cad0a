"""Narwhal: an SLO-aware HTTP router for OpenAI-compatible LLM inference engines."""

__version__ = "0.1.0"

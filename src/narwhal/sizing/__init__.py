"""Workload sizing: how many prompt tokens a request brings (`local` counts them here)."""

from narwhal.sizing.local import PromptSizer, load_sizer

__all__ = ["PromptSizer", "load_sizer"]

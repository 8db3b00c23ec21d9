"""edgemoe: serve Mixture-of-Experts LLMs from one consumer GPU plus host RAM.

`LLM` is imported lazily: the HTTP server process imports `edgemoe.*` modules and must
never pull in torch.
"""

from __future__ import annotations

from typing import Any

from edgemoe.messages import SamplingParams, StructuredOutput

__all__ = ["LLM", "SamplingParams", "StructuredOutput"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from edgemoe.llm import LLM

        return LLM
    raise AttributeError(f"module 'edgemoe' has no attribute {name!r}")

"""thunder_sgl: a program-aware scheduling router for agentic LLM inference on SGLang."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

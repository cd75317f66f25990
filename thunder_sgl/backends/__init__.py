"""Backends: one capacity unit per (worker, dp_rank), its parsers and its monitor."""

from thunder_sgl.backends.backend import Backend, Live, Tiers, backend_key

__all__ = ["Backend", "Live", "Tiers", "backend_key"]

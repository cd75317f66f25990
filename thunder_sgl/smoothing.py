"""The one exponential moving average of the router's measurements.

``ema(old, new, a)`` is ``old + a·(new − old)``, and ``new`` itself while there is no old value
(``old <= 0``: every quantity smoothed here — times, token counts, characters per token — is
positive once measured). Used for the request and tool times per backend (``Backend.served``),
a program's characters per token and expected output, and the occupancy rule's costs.
"""

from __future__ import annotations


def ema(old: float, new: float, a: float) -> float:
    return new if old <= 0 else old + a * (new - old)

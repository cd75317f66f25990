"""Small typed distributions that workload profiles are made of.

In YAML a distribution is a mapping with a ``kind`` key (or a bare number, read as ``fixed``)::

    steps:        {kind: normal, mean: 30, std: 12, min: 8, max: 100}
    output:       {kind: uniform_int, low: 100, high: 400}
    tool_seconds: {kind: lognormal, median: 0.5, p95: 8.0, max: 60}
    tool_seconds:
      kind: mixture
      components:
        - {name: search, weight: 0.5, dist: {kind: lognormal, median: 1.5, p95: 6}}

Every kind is a frozen dataclass with ``sample(rng) -> float`` over a stdlib ``random.Random``
(cheap per scalar, no numpy needed; a seed gives the same draws on a given Python version —
only ``random()`` itself is promised stable across versions). ``min``/``max`` clip a sample — a capped lognormal models a tool timeout:
the command that would have run longer takes exactly the timeout. Kinds are registered in
``KINDS``; an unknown kind, an unknown key or an impossible value raises ``ConfigError``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Protocol

from thunder_sgl.config import from_dict
from thunder_sgl.errors import ConfigError

Z95 = 1.6448536269514722
"""Standard-normal quantile of 0.95: a lognormal's p95 is median · exp(Z95 · sigma)."""


class Distribution(Protocol):
    """A non-negative random quantity. ``sample`` draws one value; its only effect is to
    advance ``rng``, and the value is a pure function of ``rng``'s state."""

    def sample(self, rng: random.Random) -> float: ...


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _clip(x: float, lo: float, hi: float | None) -> float:
    x = max(x, lo)
    return x if hi is None else min(x, hi)


@dataclass(frozen=True)
class Fixed:
    """Always the same value."""

    value: float
    """The value (>= 0)."""

    def __post_init__(self) -> None:
        _require(self.value >= 0, f"fixed value must be >= 0, got {self.value}")

    def sample(self, rng: random.Random) -> float:
        return self.value


@dataclass(frozen=True)
class UniformInt:
    """An integer uniform on [low, high], both included."""

    low: int
    """Smallest value (>= 0)."""

    high: int
    """Largest value (>= low)."""

    def __post_init__(self) -> None:
        _require(
            0 <= self.low <= self.high,
            f"uniform_int needs 0 <= low <= high, got {self.low}..{self.high}",
        )

    def sample(self, rng: random.Random) -> float:
        return float(rng.randint(self.low, self.high))


@dataclass(frozen=True)
class Normal:
    """A normal distribution clipped to [min, max]."""

    mean: float
    """Mean before clipping (>= 0)."""

    std: float
    """Standard deviation before clipping (>= 0)."""

    min: float = 0.0
    """Samples below this are raised to it (>= 0)."""

    max: float | None = None
    """Samples above this are lowered to it; None: no upper clip."""

    def __post_init__(self) -> None:
        _require(
            self.mean >= 0 and self.std >= 0,
            f"normal needs mean >= 0 and std >= 0, got {self.mean}, {self.std}",
        )
        _require(self.min >= 0, f"normal min must be >= 0, got {self.min}")
        _require(self.max is None or self.max >= self.min, "normal max must be >= min")

    def sample(self, rng: random.Random) -> float:
        return _clip(rng.normalvariate(self.mean, self.std), self.min, self.max)


@dataclass(frozen=True)
class LogNormal:
    """A lognormal given by its median and either its p95 or its sigma, clipped to [min, max]."""

    median: float
    """Median (> 0): exp(mu)."""

    p95: float | None = None
    """95th percentile before clipping (> median); give this or sigma."""

    sigma: float | None = None
    """Standard deviation of log(x) (>= 0); give this or p95."""

    min: float = 0.0
    """Samples below this are raised to it (>= 0)."""

    max: float | None = None
    """Cap (a timeout): samples above it are lowered to it; None: no cap."""

    def __post_init__(self) -> None:
        _require(self.median > 0, f"lognormal median must be > 0, got {self.median}")
        _require(
            (self.p95 is None) != (self.sigma is None),
            "lognormal needs exactly one of p95 and sigma",
        )
        _require(self.p95 is None or self.p95 > self.median, "lognormal p95 must exceed its median")
        _require(self.sigma is None or self.sigma >= 0, "lognormal sigma must be >= 0")
        _require(self.min >= 0, f"lognormal min must be >= 0, got {self.min}")
        _require(self.max is None or self.max >= max(self.min, 0.0), "lognormal max must be >= min")

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def s(self) -> float:
        """sigma, given or derived from the p95."""
        if self.sigma is not None:
            return self.sigma
        assert self.p95 is not None
        return math.log(self.p95 / self.median) / Z95

    def quantile(self, q: float) -> float:
        """The q-quantile before clipping (0 < q < 1)."""
        return math.exp(self.mu + self.s * NormalDist().inv_cdf(q))

    def sample(self, rng: random.Random) -> float:
        return _clip(rng.lognormvariate(self.mu, self.s), self.min, self.max)


@dataclass(frozen=True)
class Component:
    """One named part of a mixture (e.g. one tool kind)."""

    name: str
    """Label of the component (a tool name); reported per step."""

    weight: float
    """Relative probability (> 0); weights need not sum to 1."""

    dist: Distribution
    """Distribution of the values this component draws."""

    def __post_init__(self) -> None:
        _require(self.weight > 0, f"mixture weight of {self.name!r} must be > 0, got {self.weight}")


@dataclass(frozen=True)
class Mixture:
    """Pick a component by weight, then draw from it."""

    components: tuple[Component, ...]
    """The parts, in a fixed order (the order is part of the seed's meaning)."""

    def __post_init__(self) -> None:
        _require(len(self.components) >= 1, "mixture needs at least one component")
        names = [c.name for c in self.components]
        _require(
            len(set(names)) == len(names), f"mixture component names must be unique, got {names}"
        )

    def pick(self, rng: random.Random) -> Component:
        total = sum(c.weight for c in self.components)
        x = rng.random() * total
        for c in self.components:
            x -= c.weight
            if x < 0:
                return c
        return self.components[-1]

    def sample(self, rng: random.Random) -> float:
        return self.pick(rng).dist.sample(rng)


KINDS: dict[str, type] = {
    "fixed": Fixed,
    "uniform_int": UniformInt,
    "normal": Normal,
    "lognormal": LogNormal,
    "mixture": Mixture,
}
"""YAML ``kind`` → class. Register a new kind here."""


def parse_distribution(data: Any, where: str) -> Distribution:
    """A distribution from its YAML form (mapping with ``kind``, or a bare number)."""
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return Fixed(float(data))
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a number or a mapping with a 'kind', got {data!r}")
    body = dict(data)
    kind = body.pop("kind", None)
    if kind not in KINDS:
        raise ConfigError(
            f"{where}: unknown distribution kind {kind!r}; valid kinds: {sorted(KINDS)}"
        )
    try:
        if kind == "mixture":
            return _parse_mixture(body, where)
        return from_dict(KINDS[kind], body, where)
    except ConfigError as e:
        if e.message.startswith(where):
            raise
        raise ConfigError(f"{where}: {e.message}") from e


def _parse_mixture(body: dict[str, Any], where: str) -> Mixture:
    unknown = sorted(set(body) - {"components"})
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {where}; valid keys: ['components', 'kind']"
        )
    parts = body.get("components")
    if not isinstance(parts, list):
        raise ConfigError(f"{where}.components must be a list")
    comps = []
    for i, part in enumerate(parts):
        at = f"{where}.components[{i}]"
        if not isinstance(part, dict):
            raise ConfigError(f"{at} must be a mapping")
        part = dict(part)
        if "dist" not in part:
            raise ConfigError(f"{at} needs a 'dist'")
        dist = parse_distribution(part.pop("dist"), f"{at}.dist")
        comp = from_dict(Component, {**part, "dist": None}, at)
        comps.append(Component(comp.name, comp.weight, dist))
    return Mixture(tuple(comps))

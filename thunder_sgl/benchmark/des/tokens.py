"""Token ids of DES programs: what each request of a simulated agent sends.

A DES program talks to the simulated workers in token ids, laid out exactly as the simulator's
chat template renders a chat conversation (``sim.tokenizer.ChatTemplate``: every message is
``<|im_start|> role\\n content <|im_end|> \\n``, the prompt ends with ``<|im_start|>
assistant\\n``), so it is append-only and hits the radix cache token for token::

    prompt_0     = [system: S shared tokens] [user: instance tokens] <assistant>
    prompt_{k+1} = prompt_k + output_k + <im_end>\\n + [user: observation_k] <assistant>

Contents are random ids ≥ 2^24 (never special tokens): the system prompt is one sequence per
profile (shared by all its programs, whatever the seed), the instance and the observations are
drawn per program from ``(profile, seed, index)``, so runs are deterministic. The samples of one
RL task (``ProgramSpec.task``, a group) share the task's instance, drawn from
``(profile, seed, task)``: the group's members start with the same system + task prefix. The answers are
the simulator's own ``output_ids``.
"""

from __future__ import annotations

import zlib
from array import array

import numpy as np

from thunder_sgl.benchmark.workloads.profile import ProgramSpec, WorkloadProfile
from thunder_sgl.sim.tokenizer import IM_END, IM_START, Tokenizer

_FIRST_ID = 1 << 24
_LAST_ID = 1 << 31


def _role(role: str) -> bytes:
    return (array("I", [IM_START]) + Tokenizer.encode_uncached(role + "\n")).tobytes()


_SYSTEM = _role("system")
_USER = _role("user")
_ASSISTANT = _role("assistant")
_END = (array("I", [IM_END]) + Tokenizer.encode_uncached("\n")).tobytes()

FIRST_TEMPLATE_TOKENS = (len(_SYSTEM) + len(_END) + len(_USER) + len(_END) + len(_ASSISTANT)) // 4
"""Template tokens of the first prompt besides the system prompt and the instance."""
STEP_TEMPLATE_TOKENS = (len(_END) + len(_USER) + len(_END) + len(_ASSISTANT)) // 4
"""Template tokens each later prompt adds besides the previous output and the observation."""
SHARED_TEMPLATE_TOKENS = (len(_SYSTEM) + len(_END) + len(_USER)) // 4
"""Template tokens of the prefix every program of a profile shares (beside the system prompt)."""


def random_ids(rng: np.random.Generator, n: int) -> bytes:
    """``n`` packed native uint32 ids drawn from ``rng``, all ≥ 2^24 (never special tokens)."""
    return rng.integers(_FIRST_ID, _LAST_ID, size=n, dtype=np.uint32).tobytes() if n > 0 else b""


class TokenLayout:
    """The shared system prompt of a profile and each program's token stream."""

    def __init__(self, profile: WorkloadProfile, seed: int, text_ratio: float = 1.0,
                 reply_ratio: float = 1.0) -> None:
        self.profile = profile
        self.text_ratio = text_ratio
        """Tokens per nominal token of the workload's text (``ModelSpec.text_tokens_per_nominal``)."""
        self.reply_ratio = reply_ratio
        """Tokens per output token of an answer sent back (``ModelSpec.reply_tokens_per_output``)."""
        self.seed = seed
        name_hash = zlib.crc32(profile.name.encode())
        self._name_hash = name_hash
        system = random_ids(np.random.default_rng([name_hash, 0x5157]), self.tokens(profile.system_prompt_tokens))
        self.shared_prefix = _SYSTEM + system + _END + _USER
        """Packed tokens every program of the profile starts with."""
        self.shared_tokens = len(self.shared_prefix) >> 2

    def tokens(self, nominal: int) -> int:
        """Tokens of ``nominal`` tokens of the workload's text."""
        return nominal if self.text_ratio == 1.0 else round(nominal * self.text_ratio)

    def program(self, spec: ProgramSpec) -> ProgramTokens:
        rng = np.random.default_rng([self._name_hash, self.seed & 0xFFFFFFFF, spec.index])
        return ProgramTokens(self, spec, rng)


class ProgramTokens:
    """The growing prompt of one program."""

    __slots__ = ("spec", "rng", "prompt", "step", "layout", "replies")

    def __init__(self, layout: TokenLayout, spec: ProgramSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self.rng = rng
        self.layout = layout
        self.replies: np.random.Generator | None = None
        """Ids of answers sent back re-tokenized (``reply_ratio`` ≠ 1) and of a warm start's history."""
        if spec.task is None:
            instance = random_ids(rng, layout.tokens(spec.instance_tokens))
        else:
            instance = random_ids(np.random.default_rng([layout._name_hash, layout.seed & 0xFFFFFFFF, 0x7A5C, spec.task]),
                            layout.tokens(spec.instance_tokens))
        self.prompt = layout.shared_prefix + instance + _END + _ASSISTANT
        """Packed tokens of the next request."""
        self.step = 0
        while self.step < spec.start_step:  # a warm start: the history's answers, never computed
            n = round(spec.steps[self.step].output_tokens * layout.reply_ratio)
            self.add_reply(array("I", random_ids(self._replies(), n)), fresh=True)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) >> 2

    def _replies(self) -> np.random.Generator:
        if self.replies is None:
            lay = self.layout
            self.replies = np.random.default_rng([lay._name_hash, lay.seed & 0xFFFFFFFF, self.spec.index, 0x4E91])
        return self.replies

    def add_reply(self, output_ids: array, fresh: bool = False) -> None:
        """Append the answer of the current step and, unless it was the last (and the program
        sends no refused call after it, ``ProgramSpec.overflow_output``), its observation.
        The answer goes back as ``output_ids`` when the model's output re-encodes to itself
        (``reply_ratio`` 1), else as ``reply_ratio`` × as many other ids (the text of the output,
        tokenized again: its KV is not the output's). ``fresh``: ids already of an answer's text."""
        obs = self.layout.tokens(self.spec.steps[self.step].observation_tokens)
        self.step += 1
        ratio = self.layout.reply_ratio
        if ratio != 1.0 and not fresh:
            output_ids = array("I", random_ids(self._replies(), round(len(output_ids) * ratio)))
        tail = output_ids.tobytes() + _END
        if self.step < len(self.spec.steps) or self.spec.overflow_output:
            tail += _USER + random_ids(self.rng, obs) + _END + _ASSISTANT
        self.prompt += tail

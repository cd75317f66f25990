"""Deterministic tokenizer, append-only chat template, deterministic answers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_sgl.sim.tokenizer import ChatTemplate, Tokenizer, generate_output

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
roles = st.sampled_from(["system", "user", "assistant", "tool"])
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": texts}), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(history=messages, answer_len=st.integers(1, 300), seed=st.integers(0, 5), new=texts)
def test_next_turn_prompt_extends_previous_prompt_plus_answer(history: list[dict], answer_len: int, seed: int, new: str) -> None:
    tok = Tokenizer()
    tpl = ChatTemplate(tok)
    prompt = tpl.render(history)
    answer = generate_output(seed, len(prompt), answer_len)
    nxt = tpl.render(history + [{"role": "assistant", "content": tok.decode(answer)}, {"role": "user", "content": new}])
    assert nxt[: len(prompt) + len(answer)] == prompt + answer


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_encode_decode_round_trips(text: str) -> None:
    tok = Tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text.replace("\x00", "")
    assert tok.encode(tok.decode(ids)) == ids


def test_english_text_is_about_four_characters_per_token() -> None:
    text = ("The quick brown fox jumps over the lazy dog while the test suite runs. " * 40 + "\n") * 5
    ids = Tokenizer().encode(text)
    assert 3.8 <= len(text) / len(ids) <= 4.0


def test_answers_are_deterministic_per_seed_and_prompt() -> None:
    assert generate_output(1, 42, 50) == generate_output(1, 42, 50)
    assert generate_output(1, 42, 50) != generate_output(2, 42, 50)
    assert generate_output(1, 42, 50) != generate_output(1, 43, 50)
    assert len(generate_output(0, 7, 200_000)) == 200_000


def test_tools_and_multipart_content_render_stably() -> None:
    tpl = ChatTemplate(Tokenizer())
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    m = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
         {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]}]
    assert tpl.render(m, tools) == tpl.render(m, tools)
    assert tpl.render(m[:1], tools) == tpl.render(m[:1], tools, add_generation_prompt=False) + tpl.render([], None)

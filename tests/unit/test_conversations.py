"""Program inference (``control.conversations``): which program a request without an id is."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_sgl.control.conversations import (
    Conversations,
    Match,
    StreamAnswer,
    answer_message,
    answer_of,
    chain,
    prompt_bytes,
)

SYSTEM = {"role": "system", "content": "You are a helpful assistant that can run bash."}
TASK = {"role": "user", "content": "Fix the failing test in repo/foo."}


def call(args: dict, cid: str = "call_1", name: str = "bash") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


def test_the_chain_survives_reserialisation_tool_call_formatting_and_a_stripped_reasoning_field():
    sent = [SYSTEM, TASK,
            {"role": "assistant", "content": "Let me look.", "reasoning_content": "hmm, think first",
             "tool_calls": [call({"cmd": "ls -la", "timeout": 5}, "call_abc")]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "a.py\nb.py\n"}]
    # the client's copy: other key order and whitespace in the arguments, a new tool-call id,
    # the reasoning dropped, content as a list of parts, developer for system, a name field
    resent = [{"role": "developer", "content": [{"type": "text", "text": SYSTEM["content"]}]}, {**TASK, "name": "me"},
              {"role": "assistant", "content": "Let me look.  ",
               "tool_calls": [{"id": "xyz", "type": "function",
                               "function": {"name": "bash", "arguments": '{ "timeout": 5,  "cmd": "ls -la" }'}}]},
              {"role": "tool", "tool_call_id": "xyz", "content": "a.py\nb.py"}]
    assert chain(sent) == chain(resent)
    # what is said does count
    changed = [*resent[:2], {**resent[2], "content": "Let me look!"}, resent[3]]
    assert chain(changed)[:2] == chain(sent)[:2] and chain(changed)[2] != chain(sent)[2]
    other_args = [*resent[:2], {**resent[2], "tool_calls": [call({"cmd": "ls"})]}, resent[3]]
    assert chain(other_args)[2] != chain(sent)[2]


def test_a_conversation_lands_in_one_program_step_after_step():
    conv = Conversations(keep_seconds=100, max_programs=10)
    msgs = [SYSTEM, TASK]
    m = conv.match(msgs, 0.0)
    assert m.kind == "new" and m.program_id.startswith("inf-")
    pid = m.program_id
    for step in range(5):
        answer = {"role": "assistant", "content": f"step {step}: run ls", "reasoning_content": "x"}
        conv.answered(pid, m.head, answer, float(step))
        msgs = [*msgs, {"role": "assistant", "content": answer["content"]}, {"role": "user", "content": f"out {step}"}]
        m = conv.match(msgs, float(step))
        assert (m.kind, m.program_id) == ("matched", pid)
    assert conv.counts == {"matched": 5, "new": 1, "ambiguous": 0, "busy": 0, "overflow": 0}


def test_a_resent_earlier_step_lands_in_its_program():
    conv = Conversations(100, 10)
    m0 = conv.match([SYSTEM, TASK], 0.0)
    conv.answered(m0.program_id, m0.head, {"content": "a0"}, 0.0)
    step1 = [SYSTEM, TASK, {"role": "assistant", "content": "a0"}, {"role": "user", "content": "o0"}]
    m1 = conv.match(step1, 1.0)
    conv.answered(m1.program_id, m1.head, {"content": "a1"}, 1.0)
    again = conv.match(step1, 2.0)  # the agent retries step 1
    assert again.program_id == m0.program_id == m1.program_id


def test_conversations_with_one_head_are_told_apart_by_their_answers_and_identical_ones_are_never_merged():
    conv = Conversations(100, 100)
    firsts = [conv.match([SYSTEM, TASK], 0.0) for _ in range(3)]
    assert len({m.program_id for m in firsts}) == 3
    answers = ["try ls", "try cat", "try ls"]  # the first and third answered alike
    for m, a in zip(firsts, answers, strict=True):
        conv.answered(m.program_id, m.head, {"content": a}, 0.0)
    nxt = [conv.match([SYSTEM, TASK, {"role": "assistant", "content": a}, {"role": "user", "content": "obs"}], 1.0)
           for a in answers]
    assert nxt[1].kind == "matched" and nxt[1].program_id == firsts[1].program_id
    assert nxt[0].kind == nxt[2].kind == "ambiguous" and nxt[0].program_id is None
    assert conv.counts["ambiguous"] == 2


def test_a_client_that_drops_an_answer_from_its_history_stays_in_its_program():
    """mini-swe-agent 2.x leaves an answer it cannot parse out of its history: its next request
    is the previous one plus the format error. The head (the request without the answer)
    matches a request that adds to it; an agent's first request matches no head (every agent
    of that task has that head), and agents whose requests are identical stay ambiguous."""
    conv = Conversations(100, 100)
    err = {"role": "user", "content": "Format error: exactly one bash block, please."}
    for task in ("task A", "task B"):
        msgs = [SYSTEM, {"role": "user", "content": task}]
        m = conv.match(msgs, 0.0)
        pid = m.program_id
        for step in range(4):
            assert (m.kind, m.program_id) == ("new" if step == 0 else "matched", pid)
            conv.answered(pid, m.head, {"content": f"junk {step}"}, float(step))
            msgs = [*msgs, err]
            m = conv.match(msgs, float(step))
    same = [conv.match([SYSTEM, TASK], 2.0) for _ in range(2)]
    assert [m.kind for m in same] == ["new", "new"]  # a head is no match for an equal request
    for m in same:
        conv.answered(m.program_id, m.head, {"content": "junk"}, 2.0)
    assert conv.match([SYSTEM, TASK, err], 3.0).kind == "ambiguous"


def test_identical_agents_never_continue_the_one_that_was_matched_while_it_was_alone():
    """A busy machine: the first agent's second step (its answer dropped, the format error
    added) arrives while its program is the only one answered, and is matched. The others'
    second steps are ambiguous and contest that head, so no later step of theirs — byte for
    byte the first agent's — lands in its program; the mark expires with the records."""
    conv = Conversations(keep_seconds=10, max_programs=100)
    err = {"role": "user", "content": "Format error: exactly one bash block, please."}
    first = conv.match([SYSTEM, TASK], 0.0)
    conv.answered(first.program_id, first.head, {"content": "junk"}, 0.0)
    alone = conv.match([SYSTEM, TASK, err], 0.5)
    assert (alone.kind, alone.program_id) == ("matched", first.program_id)
    conv.answered(first.program_id, alone.head, {"content": "junk"}, 0.5)
    others = [conv.match([SYSTEM, TASK], 1.0) for _ in range(2)]
    for m in others:
        conv.answered(m.program_id, m.head, {"content": "junk"}, 1.0)
    assert [conv.match([SYSTEM, TASK, err], 2.0).kind for _ in others] == ["ambiguous"] * 2
    later = [conv.match([SYSTEM, TASK, err, err], 3.0) for _ in range(3)]
    assert [m.kind for m in later] == ["ambiguous"] * 3
    assert conv.counts == {"matched": 1, "new": 3, "ambiguous": 5, "busy": 0, "overflow": 0}
    # without contest, the head is one program's again once the marks expire
    conv.expire(20.0)
    conv.answered(first.program_id, alone.head, {"content": "junk"}, 20.0)
    assert conv.match([SYSTEM, TASK, err, err], 20.0).program_id == first.program_id


def test_records_expire_by_age_and_by_count():
    conv = Conversations(keep_seconds=10, max_programs=2)
    ms = []
    for i in range(3):
        m = conv.match([SYSTEM, {"role": "user", "content": f"task {i}"}], float(i))
        conv.answered(m.program_id, m.head, {"content": "ok"}, float(i))
        ms.append(m)
    assert len(conv) == 2 and ms[0].program_id not in conv  # the oldest went past max_programs
    conv.expire(11.5)
    assert len(conv) == 1 and ms[2].program_id in conv
    conv.forget(ms[2].program_id)
    assert len(conv) == 0
    again = conv.match([SYSTEM, {"role": "user", "content": "task 2"}, {"role": "assistant", "content": "ok"}], 13.0)
    assert again.kind == "new"


def test_the_answer_of_a_stream_is_assembled_from_its_deltas():
    sa = StreamAnswer()
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let "}}]},
        {"choices": [{"index": 0, "delta": {"content": "me look."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "bash", "arguments": '{"cmd": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}}]},
        {"choices": [{"index": 1, "delta": {"content": "another choice"}}]},
        {"choices": [], "usage": {"prompt_tokens": 3}},
    ]
    for e in events:
        sa.feed(e)
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Let me look.",
                                                  "tool_calls": [call({"cmd": "ls"}, "zz")]}}]}
    assert chain([sa.message()]) == chain([answer_message(whole)])


@settings(max_examples=60, deadline=None)
@given(agents=st.integers(2, 32), steps=st.integers(1, 6), distinct=st.floats(0.0, 1.0), seed=st.integers(0, 10**6))
def test_agents_sharing_a_system_prompt_and_a_task_are_never_misattributed(agents, steps, distinct, seed):
    """Every agent's requests land in one program of its own, or (while its answers equal
    another agent's) are ambiguous; no request ever lands in another agent's program."""
    rng = random.Random(seed)
    conv = Conversations(1e9, 10_000)
    hist = {a: [SYSTEM, TASK] for a in range(agents)}
    owner: dict[str, int] = {}
    for step in range(steps):
        for a in rng.sample(range(agents), agents):
            m = conv.match(hist[a], float(step))
            if m.kind == "ambiguous":
                reply = "same answer"  # the pair stays ambiguous only while answers agree
            else:
                assert owner.setdefault(m.program_id, a) == a
                reply = f"answer {a}" if rng.random() < distinct else "same answer"
                conv.answered(m.program_id, m.head, {"content": reply}, float(step))
            hist[a] = [*hist[a], {"role": "assistant", "content": reply}, {"role": "user", "content": f"obs {step}"}]


@settings(max_examples=80, deadline=None)
@given(agents=st.integers(2, 12), steps=st.integers(2, 6), seed=st.integers(0, 10**6))
def test_identical_agents_that_drop_their_answers_never_land_in_another_agents_program(agents, steps, seed):
    """Agents whose requests are byte for byte the same (one task, every answer dropped, the
    format error added), interleaved at random — an agent sends its next step only once its
    answer came: a request lands in its own agent's program or in none."""
    rng = random.Random(seed)
    conv = Conversations(1e9, 10_000)
    err = {"role": "user", "content": "Format error."}
    hist = {a: [SYSTEM, TASK] for a in range(agents)}
    out: dict[int, Match] = {}  # agent → its match, answer not yet in
    sent = dict.fromkeys(range(agents), 0)
    owner: dict[str, int] = {}
    now = 0.0
    while any(sent[a] < steps for a in range(agents)) or out:
        now += 1.0
        a = rng.choice([a for a in range(agents) if a in out or sent[a] < steps])
        if a in out:  # its answer comes
            m = out.pop(a)
            if m.program_id is not None:
                conv.answered(m.program_id, m.head, {"content": "junk"}, now)
            hist[a] = [*hist[a], err]
        else:
            m = conv.match(hist[a], now)
            if m.program_id is not None:
                assert owner.setdefault(m.program_id, a) == a
            out[a] = m
            sent[a] += 1


def _prompt_step(c: Conversations, prompt: str | list[int], answer: dict, now: float) -> str | None:
    """Match a prompt (rule 6) and record its answer; returns the program (None: ambiguous)."""
    data, tokens = prompt_bytes(prompt)
    m, head = c.match_prompt(data, tokens, now)
    if m.program_id is not None:
        c.answered_prompt(m.program_id, head, answer, now)
    return m.program_id


def test_prompts_continue_the_program_whose_prompt_and_answer_they_extend_longest_first():
    c = Conversations(keep_seconds=600, max_programs=100)
    head = "You are an agent. Task: fix foo. "
    a = _prompt_step(c, head, {"content": "I run ls."}, 0.0)
    b = _prompt_step(c, head, {"content": "I run cat."}, 0.0)  # the same head: told apart by the answers
    assert a != b and c.counts["new"] == 2
    assert _prompt_step(c, head + "I run ls." + " a.py b.py ", {"content": "done"}, 1.0) == a
    assert _prompt_step(c, head + "I run cat." + " error ", {"content": "retry"}, 1.0) == b
    # a's longer expectation wins over its own earlier one
    assert _prompt_step(c, head + "I run ls. a.py b.py done more", {"content": "x"}, 2.0) == a
    assert c.counts == {"matched": 3, "new": 2, "ambiguous": 0, "busy": 0, "overflow": 0}
    # a head matches only a prompt that adds to it: the bare head again is a new agent's start
    assert _prompt_step(c, head, {"content": "z"}, 3.0) not in (a, b, None) and c.counts["new"] == 3
    # one that adds to the head but to neither answer continues all three heads: ambiguous
    assert _prompt_step(c, head + "I run pwd.", {"content": "z"}, 4.0) is None and c.counts["ambiguous"] == 1


def test_token_prompts_use_output_ids_and_never_match_text():
    c = Conversations(keep_seconds=600, max_programs=100)
    ids = list(range(100, 160))
    p = _prompt_step(c, ids, {"content": "ignored", "output_ids": [7, 8, 9]}, 0.0)
    assert _prompt_step(c, [*ids, 7, 8, 9, 42, 43], {"output_ids": [1]}, 1.0) == p
    # the same bytes as text are another domain
    text = prompt_bytes(ids)[0].decode("latin-1")
    m, _ = c.match_prompt(text.encode("latin-1"), False, 2.0)
    assert m.kind == "new"
    assert prompt_bytes(["a", "b"]) is None and prompt_bytes([]) is None and prompt_bytes([1, True]) is None


def test_forgetting_a_prompt_program_drops_its_lengths_and_keys():
    c = Conversations(keep_seconds=10, max_programs=100)
    p = _prompt_step(c, "x" * 100, {"content": "y" * 10}, 0.0)
    assert c._plens_sorted == [100, 110]
    c.forget(p)
    assert c._plens_sorted == [] and not c._index and not c._heads
    q = _prompt_step(c, "x" * 100, {"content": "y"}, 0.0)
    c.expire(20.0)  # unmatched past keep_seconds
    assert q not in c and c._plens_sorted == []


def test_answers_of_prompt_routes():
    assert answer_of("completions", {"choices": [{"text": "hi"}]}) == {"content": "hi"}
    assert answer_of("generate", {"text": "hi", "output_ids": [1]}) == {"content": "hi", "output_ids": [1]}
    assert answer_of("completions", {"choices": []}) is None and answer_of("generate", None) is None
    s = StreamAnswer()
    for t in ("a", "b"):
        s.feed({"choices": [{"index": 0, "text": t}]})
    assert s.message()["content"] == "ab"


def test_the_end_hint_reads_a_finishing_tool_a_marker_or_tools_left_uncalled():
    """Rule 7: a call of an end tool, or an end marker in the text or a tool call's arguments,
    is a sign; tools offered and none called is plain; anything else is no hint."""
    from thunder_sgl.control.conversations import PLAIN, SIGN, end_hint

    tools, markers = frozenset({"finish", "submit"}), ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",)

    def call(name: str, args: str) -> dict:
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}]}

    assert end_hint(call("finish", "{}"), True, tools, markers) == SIGN
    assert end_hint(call("bash", '{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}'), True, tools, markers) == SIGN
    text = {"role": "assistant", "content": "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"}
    assert end_hint(text, False, tools, markers) == SIGN
    assert end_hint({"content": [{"type": "text", "text": "done COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]},
                    False, tools, markers) == SIGN
    assert end_hint(call("bash", '{"command": "ls"}'), True, tools, markers) is None
    assert end_hint({"role": "assistant", "content": "All done."}, True, tools, markers) == PLAIN
    assert end_hint({"role": "assistant", "content": "All done."}, False, tools, markers) is None
    assert end_hint(text, False, tools, ()) is None  # markers off
    assert end_hint(None, True, tools, markers) is None


def test_the_engines_refusals_for_the_context_length_are_read_and_no_other_bad_request_is():
    """Rule 7, *context overflow*: the 400s of the real SGLang 0.5.23 CPU engine, captured from
    every inference route (``tests/data/sglang-context-overflow.json``), and two 400s of other
    kinds from the same engine."""
    import json
    from pathlib import Path

    from thunder_sgl.control.conversations import context_overflow

    doc = json.loads((Path(__file__).parents[1] / "data" / "sglang-context-overflow.json").read_text())
    assert len(doc["cases"]) == 8 and sum(c["overflow"] for c in doc["cases"]) == 6
    for c in doc["cases"]:
        assert c["status"] == 400
        assert context_overflow(c["status"], c["body"].encode()) is c["overflow"], c["case"]
        assert not context_overflow(500, c["body"].encode())  # a failure, not a refusal
    assert context_overflow(400, b'{"error": {"message": "too long", "code": "context_length_exceeded"}}')  # OpenAI's
    assert context_overflow(400, b"Input length (50000 tokens) exceeds the maximum allowed length (16378 tokens).")
    assert not context_overflow(400, b"") and not context_overflow(400, b"[1, 2]")

"""Parsing the group of an inference request: body field, header, derived from the program id."""

from __future__ import annotations

import re

import orjson
import pytest

from thunder_sgl.errors import BadRequest
from thunder_sgl.gateway.inbound import parse_inbound

CHAT = {"model": "m", "program_id": "task7-s3",
        "messages": [{"role": "system", "content": "S" * 400}, {"role": "user", "content": "T" * 800}]}


def parse(body, headers=None, pattern=None):
    return parse_inbound("chat", orjson.dumps(body), headers or {}, re.compile(pattern) if pattern else None)


def test_group_id_from_body_is_stripped_and_sized_by_the_task_message():
    i = parse({**CHAT, "group_id": "task7"})
    assert (i.group_id, i.group_chars) == ("task7", 800) and "group_id" not in i.body


@pytest.mark.parametrize(
    ("body_gid", "headers", "pattern", "expected"),
    [
        ("b", {"x-group-id": "h"}, None, "b"),   # body wins
        (None, {"x-group-id": "h"}, None, "h"),
        (None, {}, r"^(.+)-s\d+$", "task7"),     # derived: the first capture group
        (None, {}, r"^task\d+", "task7"),        # derived: the whole match
        (None, {}, r"^(.+)/\d+$", None),         # no match: no group
        ("b", {}, r"^(.+)-s\d+$", "b"),          # a named group beats the derivation
        (None, {}, None, None),
    ],
)
def test_group_sources_in_order(body_gid, headers, pattern, expected):
    body = dict(CHAT)
    if body_gid is not None:
        body["group_id"] = body_gid
    assert parse(body, headers, pattern).group_id == expected


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({**CHAT, "group_id": True}, {}),
        ({**CHAT, "group_id": {"id": 1}}, {}),
        ({**CHAT, "group_id": ""}, {}),
        ({**CHAT, "group_id": "has space"}, {}),
        ({**CHAT, "group_id": "x" * 257}, {}),
        (CHAT, {"x-group-id": "bad\nid"}),
        ({k: v for k, v in CHAT.items() if k != "program_id"} | {"group_id": "task7"}, {}),  # a group needs a program
    ],
)
def test_malformed_group_ids_are_a_400_naming_group_id(body, headers):
    with pytest.raises(BadRequest) as e:
        parse(body, headers)
    assert e.value.status == 400 and e.value.param == "group_id" and e.value.code == "invalid_group_id"


def test_a_null_group_id_means_none():
    assert parse({**CHAT, "group_id": None}).group_id is None

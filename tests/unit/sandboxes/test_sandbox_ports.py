"""Port allocator: hands out free ports, all or none, fails clearly when exhausted, reclaims."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_sgl.errors import Conflict, Overloaded
from thunder_sgl.sandboxes.ports import PortAllocator, port_is_free


def always_free(port: int) -> bool:
    return True


def test_hands_out_distinct_ports_round_robin_and_reclaims() -> None:
    a = PortAllocator((5000, 5003), probe=always_free)
    assert a.allocate("p1", 2) == [5000, 5001]
    assert a.allocate("p2", 1) == [5002]
    assert a.owned("p1") == [5000, 5001] and a.owner_of(5002) == "p2" and a.in_use == 3
    assert a.release_owner("p1") == [5000, 5001]
    assert a.release_owner("p1") == []  # idempotent
    # Round robin: the port just reclaimed is reused last.
    assert a.allocate("p3", 2) == [5003, 5000]
    assert a.in_use == 3


def test_exhausted_range_raises_503_and_takes_nothing() -> None:
    a = PortAllocator((5000, 5002), probe=always_free)
    a.allocate("p1", 2)
    with pytest.raises(Overloaded) as e:
        a.allocate("p2", 2)
    assert e.value.status == 503 and e.value.code == "ports_exhausted"
    assert e.value.message == "no 2 free port(s) in 5000..5002: 2 handed out, 0 more bound by other processes"
    assert a.owned("p2") == [] and a.in_use == 2
    a.release_owner("p1")
    assert a.allocate("p2", 2) == [5002, 5000]


def test_zero_ports_is_nothing() -> None:
    assert PortAllocator((5000, 5000), probe=always_free).allocate("p", 0) == []


@pytest.fixture
def bound_port() -> Iterator[int]:
    """A port some other process holds (bound and listening on 127.0.0.1)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_skips_a_port_that_is_bound_by_someone_else(bound_port: int) -> None:
    assert not port_is_free(bound_port)
    lo = bound_port
    hi = min(bound_port + 50, 65535)
    a = PortAllocator((lo, hi))
    got = a.allocate("p", 1)
    assert got != [bound_port] and port_is_free(got[0])


def test_only_port_bound_elsewhere_means_exhausted(bound_port: int) -> None:
    a = PortAllocator((bound_port, bound_port))
    with pytest.raises(Overloaded, match="1 more bound by other processes"):
        a.allocate("p", 1)


def test_reserve_registers_a_port_and_refuses_another_owner() -> None:
    a = PortAllocator((5000, 5001), probe=always_free)
    a.reserve("p1", 5000)
    a.reserve("p1", 5000)  # idempotent
    a.reserve("p1", 9999)  # outside the range: recorded too
    with pytest.raises(Conflict) as e:
        a.reserve("p2", 5000)
    assert e.value.status == 409 and e.value.message == "port 5000 belongs to another program"
    assert a.allocate("p2", 1) == [5001]
    assert a.release_owner("p1") == [5000, 9999]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.booleans()), max_size=40))
def test_no_port_ever_has_two_owners(ops: list[tuple[str, int, bool]]) -> None:
    a = PortAllocator((6000, 6009), probe=always_free)
    for owner, n, release in ops:
        if release:
            a.release_owner(owner)
            continue
        try:
            a.allocate(owner, n)
        except Overloaded:
            pass
        owned = [set(a.owned(o)) for o in "abc"]
        assert sum(map(len, owned)) == a.in_use <= 10
        assert not (owned[0] & owned[1] or owned[0] & owned[2] or owned[1] & owned[2])

"""Session-referenced KV, as SGLang 0.5.23's ``--enable-session-radix-cache``.

A request that carries a ``session_id`` leaves, when it finishes, a *reference* from its session
to the radix node where its prompt + output insertion ended (the session's leaf): every node on
the path from the root to that leaf counts one more covering session (``Node.refs``; SGLang's
``session_ref``). Device eviction takes unreferenced KV first, then the least referenced, then
the least recently used (``tiers.KVCache``: SGLang's ``_session_ref_eviction_strategy`` is
``(ref > 0, ref, LRU priority)``), so referenced KV is evicted only when nothing else is left.
A shared prefix covered by many sessions goes last of all.

``close`` (``POST /close_session``) removes the session's reference; its KV is then ordinary LRU
cache. A request of a closed session that finishes afterwards does not register again unless
the session was reopened by a newer request (SGLang's generation check and tombstones). A
session keeps one leaf: agent conversations are append-only, so each new leaf extends the last
(SGLang keeps a set of frontier leaves per session for diverging branches: not modelled).
When the node of a session's leaf leaves the tree (evicted from every tier) the registration
moves to the parent, which its references already covered.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from thunder_sgl.sim.radix import Node

TOMBSTONES = 8192
"""Closed sessions remembered (SGLang's ``_CLOSED_SESSION_TOMBSTONE_LIMIT``)."""


class SessionRefs:
    def __init__(self, root: Node, touch: Callable[[Node], None]) -> None:
        self.root = root
        self._touch = touch
        """Re-queue a node whose eviction priority dropped (a reference removed)."""
        self.leaf: dict[str, Node] = {}
        self.generation: dict[str, int] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        self._gen = 0

    def open(self, sid: str) -> int:
        """The generation of ``sid`` for a request arriving now (opens a new one if needed)."""
        g = self.generation.get(sid)
        if g is None:
            self.closed.pop(sid, None)
            self._gen += 1
            g = self.generation[sid] = self._gen
        return g

    def register(self, sid: str, generation: int, leaf: Node) -> None:
        """A request of ``sid`` (opened at ``generation``) finished with its KV ending at ``leaf``."""
        if sid in self.closed or self.generation.get(sid) != generation or leaf is self.root:
            return
        old = self.leaf.get(sid)
        if old is leaf:
            return
        if old is not None:
            self._uncover(sid, old)
        self._cover(sid, leaf)

    def close(self, sid: str) -> bool:
        """Drop the session's reference; True if it had one."""
        self.generation.pop(sid, None)
        self.closed[sid] = None
        self.closed.move_to_end(sid)
        while len(self.closed) > TOMBSTONES:
            self.closed.popitem(last=False)
        leaf = self.leaf.get(sid)
        if leaf is None:
            return False
        self._uncover(sid, leaf)
        return True

    def removed(self, nd: Node, heir: Node) -> None:
        """``nd`` leaves the tree; sessions registered on it move to ``heir`` (an ancestor)."""
        if not nd.sessions:
            return
        for sid in nd.sessions:
            self.leaf[sid] = heir
            if heir is not self.root:
                if heir.sessions is None:
                    heir.sessions = set()
                heir.sessions.add(sid)
            else:
                del self.leaf[sid]
        nd.sessions = None

    def reset(self) -> None:
        self.leaf.clear()

    # ---- coverage --------------------------------------------------------------------------
    def _cover(self, sid: str, leaf: Node) -> None:
        self.leaf[sid] = leaf
        if leaf.sessions is None:
            leaf.sessions = set()
        leaf.sessions.add(sid)
        n: Node | None = leaf
        while n is not None and n is not self.root:
            n.refs += 1
            n = n.parent

    def _uncover(self, sid: str, leaf: Node) -> None:
        del self.leaf[sid]
        if leaf.sessions is not None:
            leaf.sessions.discard(sid)
            if not leaf.sessions:
                leaf.sessions = None
        n: Node | None = leaf
        while n is not None and n is not self.root:
            n.refs -= 1
            self._touch(n)  # less referenced: it may be evicted sooner than its queued entry says
            n = n.parent

"""Python re-implementations of the stock routing policies, as they route HTTP requests.

Each policy is one class with one decision method, ``select(request) -> worker index``, plus
hooks with no-op defaults: ``on_complete(index)`` when a request routed there ends,
``poll(now, loads)`` with fresh ``/v1/loads`` readings (only policies with ``poll_interval_s``),
``evict(now)`` for periodic tree maintenance (only policies with ``eviction_interval_s``).
Workers are indices ``0..n-1`` in registration order, all healthy. ``select`` counts the
request as in flight on the chosen worker: the routers' load guard (increment on send,
decrement on response) is folded into ``select`` / ``on_complete``.

Sources read (cited by path; "repo" is upstream and may be newer than the release):

- sglang_router 0.3.2: ``sgl-project/sglang`` ``sgl-model-gateway/src/policies/cache_aware.rs``,
  ``tree.rs``, ``round_robin.rs``; behaviour observed against mock workers in
  ``docs/sglang-surface.md`` §3.3 (the least-loaded-ties-to-first defect, issue #32983).
- smg 1.13.0: ``lightseekorg/smg`` ``model_gateway/src/policies/cache_aware.rs`` (repo) and
  the installed package's ``--help`` text for the spill gate, the whole-tree size bound and
  worker overload protection (``docs/sglang-surface.md`` §4).

Characters. Both routers' HTTP path keeps an approximate radix tree of request *text*, one
character per step, children keyed by their first character. In the DES a request is token ids;
``text_key`` spells each token as a short English word (the words the benchmark's HTTP and real
drivers write, ``textgen``) and the tree works on those characters, so sizes are in characters
as upstream. The spelling matters: where two prompts part (a new program's task after the
shared system prompt), the next characters begin a common word, so an earlier program's branch
usually shares them, the match descends into that branch and upstream returns a tenant of
*that* node. Keyed by whole token ids (as the DES did until 2026-12-06) the match stopped at the
shared prompt's node and every new program went to one tenant: one worker of two took three
quarters of a two-engine cpu-agent run's requests, where the real sglang_router 0.3.2, on the
same simulated workers over HTTP, kept both busy in two runs of four (in the other two its
shared nodes happened to prefer one worker; ``bench/results/des-stock-router-chars/``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from thunder_sgl.backends.parse import RankLoad
from thunder_sgl.sim.radix import common_prefix_bytes
from thunder_sgl.textgen import WORDS

CHARS_PER_TOKEN = 4
"""Characters of chat text per token (the simulator's tokenizer: just under 4)."""


def _word_table() -> tuple[np.ndarray, np.ndarray]:
    words = [w.encode() + b" " for w in WORDS]
    width = max(len(w) for w in words)
    table = np.zeros((len(words), width), dtype=np.uint8)
    for i, w in enumerate(words):
        table[i, : len(w)] = np.frombuffer(w, dtype=np.uint8)
    return table, np.array([len(w) for w in words])


_WORDS, _WORD_LEN = _word_table()

MAX_TREE_SIZE_CHARS = 1 << 26
"""``--max-tree-size`` default of both routers (characters)."""


def text_key(tokens: bytes) -> bytes:
    """The routed text of a prompt given as packed uint32 token ids: each token spelt as one
    word of ``textgen.WORDS`` and a space, chosen by its id (a pure function, so equal token
    prefixes give equal text). The benchmark's HTTP and real drivers send text of those same
    words, so the router's tree branches here as it does on their requests."""
    ids = np.frombuffer(tokens, dtype=np.uint32).astype(np.uint64)
    w = ((ids * np.uint64(0x9E3779B1)) >> np.uint64(11)) % np.uint64(len(_WORDS))
    rows = _WORDS[w]
    return rows[np.arange(rows.shape[1])[None, :] < _WORD_LEN[w][:, None]].tobytes()


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a stock router sees of one request."""

    key: bytes
    """The routed text, one byte per character (``text_key`` of the prompt's token ids)."""
    program_id: str | None = None
    """Only routers with a sticky policy read it (none of these)."""
    now: float = 0.0


class Policy:
    """Base: hooks with no-op defaults; ``loads`` are in-flight requests per worker."""

    name = "policy"
    poll_interval_s: float | None = None
    eviction_interval_s: float | None = None

    def __init__(self, n_workers: int) -> None:
        if n_workers < 1:
            raise ValueError("need at least one worker")
        self.n = n_workers
        self.loads = [0] * n_workers

    def select(self, request: RouteRequest) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_complete(self, index: int) -> None:
        self.loads[index] = max(0, self.loads[index] - 1)

    def poll(self, now: float, loads: Sequence[Sequence[RankLoad]]) -> None:
        """Fresh ``/v1/loads`` readings, one list of ranks per worker."""

    def evict(self, now: float) -> None:
        """Periodic maintenance."""

    def on_release(self, program_id: str) -> None:
        """The program ended (the agent released it)."""

    def _send(self, index: int) -> int:
        self.loads[index] += 1
        return index

    def _least_loaded(self, candidates: Sequence[int]) -> int:
        """Fewest in-flight requests; ties go to the first candidate (Rust ``min_by_key``)."""
        return min(candidates, key=self.loads.__getitem__)


class RoundRobin(Policy):
    """``round_robin``: an atomic counter modulo the healthy workers (``round_robin.rs``)."""

    name = "round_robin"

    def __init__(self, n_workers: int) -> None:
        super().__init__(n_workers)
        self._counter = 0

    def select(self, request: RouteRequest) -> int:
        i = self._counter % self.n
        self._counter += 1
        return self._send(i)


# ---- the approximate tree ------------------------------------------------------------------
def _mix(x: int) -> int:
    """A 64-bit mix (splitmix64's finaliser): a fixed pseudo-random function of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class _Node:
    __slots__ = ("key", "children", "tenants", "parent", "salt")

    def __init__(self, key: bytes, parent: _Node | None, salt: int = 0) -> None:
        self.key = key
        self.salt = salt
        """Seeds this node's order of tenants (``ApproxTree.pick``)."""
        self.children: dict[int, _Node] = {}
        """By the first character (byte) of the child's edge."""
        self.tenants: dict[int, int] = {}
        """tenant → last access epoch; insertion order stands for upstream's tenant choice."""
        self.parent = parent


class ApproxTree:
    """Multi-tenant radix tree of routed text (``tree.rs``): every node on an inserted path
    carries the tenant; a leaf's access epoch orders LRU eviction; a prefix match returns the
    matched length (partial edges count) and one tenant of the deepest matched node.

    Which tenant (``order``): smg returns the node's cached "last tenant" (the tenant that created
    the node, copied on split): ``"earliest"``, the earliest tenant still on the node, which is the
    creator whenever it remains. sglang_router 0.3.2 takes the first of the node's DashMap in
    iteration order, and each node's map hashes with its own random state (cloned on a split):
    ``"dashmap"``, a fixed pseudo-random order of the tenants per node, drawn from the node's
    creation number, so a run is deterministic while nodes disagree as upstream's do.
    """

    def __init__(self, order: str = "earliest") -> None:
        if order not in ("earliest", "dashmap"):
            raise ValueError(f"unknown tenant order {order!r}")
        self.order = order
        self._made = 0
        self.root = _Node(b"", None)
        self.sizes: dict[int, int] = {}
        """Characters per tenant, as ``tenant_char_count``."""
        self._epoch = 0

    def add_tenant(self, tenant: int) -> None:
        self.root.tenants.setdefault(tenant, 0)
        self.sizes.setdefault(tenant, 0)

    def _tick(self) -> int:
        self._epoch += 1
        return self._epoch

    def _claim(self, node: _Node, tenant: int, epoch: int) -> None:
        if tenant not in node.tenants:
            node.tenants[tenant] = epoch
            self.sizes[tenant] = self.sizes.get(tenant, 0) + len(node.key)

    def insert(self, key: bytes, tenant: int) -> None:
        self.add_tenant(tenant)
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                leaf = _Node(key[pos:], node, self._salt())
                node.children[key[pos]] = leaf
                self._claim(leaf, tenant, self._tick())
                return
            ck = child.key
            if key.startswith(ck, pos):
                self._claim(child, tenant, 0)
                node, pos = child, pos + len(ck)
                continue
            a = key[pos : pos + len(ck)]
            shared = common_prefix_bytes(a, ck[: len(a)])
            mid = _Node(ck[:shared], node, child.salt)  # the split keeps the child's tenants (cloned map)
            mid.tenants = dict(child.tenants)
            child.key = ck[shared:]
            child.parent = mid
            mid.children[child.key[0]] = child
            node.children[ck[0]] = mid
            self._claim(mid, tenant, 0)
            node, pos = mid, pos + shared
        node.tenants[tenant] = self._tick()  # the path ends on an existing node: refresh it

    def match(self, key: bytes) -> tuple[int, int | None]:
        """(matched characters, tenant of the deepest matched node; None for an empty tree).
        A partial match of a child's edge ends in that child, as upstream's does."""
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            ck = child.key
            if key.startswith(ck, pos):
                node, pos = child, pos + len(ck)
                continue
            a = key[pos : pos + len(ck)]
            pos += common_prefix_bytes(a, ck[: len(a)])
            node = child
            break
        return pos, self.pick(node)

    def pick(self, node: _Node) -> int | None:
        """The tenant a match ending at ``node`` returns (``order``)."""
        if self.order == "earliest" or len(node.tenants) < 2:
            return next(iter(node.tenants), None)
        return min(node.tenants, key=lambda t: _mix(node.salt ^ (t + 1)))

    def _salt(self) -> int:
        self._made += 1
        return _mix(self._made)

    @property
    def total_size(self) -> int:
        return sum(self.sizes.values())

    def _leaves(self) -> list[tuple[int, int, int, _Node]]:
        """(epoch, seq, tenant, node) for every node that is a leaf of one of its tenants."""
        out: list[tuple[int, int, int, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            below: set[int] = set()
            for c in node.children.values():
                stack.append(c)
                below.update(c.tenants)
            if node is self.root:
                continue
            for t, ts in node.tenants.items():
                if t not in below:
                    out.append((ts, len(out), t, node))
        return out

    def evict(self, max_size: int, per_tenant: bool) -> int:
        """Drop least recently used leaves until every tenant (``per_tenant``, 0.3.2's
        ``evict_tenant_by_size``) or the whole tree (smg) holds at most ``max_size`` characters.
        Returns characters freed."""
        total = self.total_size

        def over(t: int) -> bool:
            return self.sizes[t] > max_size if per_tenant else total > max_size

        if not any(over(t) for t in self.sizes):
            return 0
        heap = self._leaves()
        heapq.heapify(heap)
        seq, freed = len(heap), 0
        while heap:
            _, _, t, node = heapq.heappop(heap)
            if not per_tenant and not over(t):
                break
            if not over(t) or t not in node.tenants or any(t in c.tenants for c in node.children.values()):
                continue  # within bound, or a stale entry
            del node.tenants[t]
            size = len(node.key)
            self.sizes[t] -= size
            total -= size
            freed += size
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants:
                del parent.children[node.key[0]]
            if parent is not self.root and t in parent.tenants and not any(t in c.tenants for c in parent.children.values()):
                seq += 1
                heapq.heappush(heap, (parent.tenants[t], seq, t, parent))
        return freed


# ---- cache-aware policies -------------------------------------------------------------------
class SglangCacheAware(Policy):
    """``cache_aware`` of sglang_router 0.3.2 (``cache_aware.rs``, ``tree.rs``), HTTP mode.

    1. Load = in-flight requests per worker (the router's own counter).
    2. Imbalanced when ``max − min > balance_abs_threshold`` (64) and
       ``max > min × balance_rel_threshold`` (1.5): the least-loaded worker.
    3. Else ``match_rate = matched / input`` over the tree; above ``cache_threshold`` (0.3) the
       matched tenant, else the least-loaded worker, ties to the first (the defect of §3.8:
       sequential distinct prompts at zero load all go to worker 0).
    4. The request is inserted under the chosen worker in every case.
    5. Every ``eviction_interval_secs`` (60) LRU leaves are evicted per worker until each holds at
       most ``max_tree_size`` characters (2^26).

    Simplified: no health checks, retries or circuit breaker (every worker is healthy). The
    tenant of a node several workers share is the first in that node's own pseudo-random order
    (``ApproxTree``, order ``"dashmap"``).
    """

    name = "sglang-cache_aware"
    eviction_interval_s: float | None = 60.0
    tenant_order = "dashmap"
    """Which tenant of a matched node (``ApproxTree``): 0.3.2's DashMap iteration order."""

    def __init__(
        self,
        n_workers: int,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_size: int = MAX_TREE_SIZE_CHARS,
        eviction_interval_s: float = 60.0,
    ) -> None:
        super().__init__(n_workers)
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.max_tree_size = max_tree_size
        self.eviction_interval_s = eviction_interval_s
        self.tree = ApproxTree(self.tenant_order)
        for i in range(n_workers):
            self.tree.add_tenant(i)
        self.decisions = {"imbalanced": 0, "match": 0, "miss": 0}

    def _imbalanced(self) -> bool:
        lo, hi = min(self.loads), max(self.loads)
        return hi - lo > self.abs_threshold and hi > lo * self.rel_threshold

    def select(self, request: RouteRequest) -> int:
        workers = range(self.n)
        if self._imbalanced():
            i = self._least_loaded(workers)
            self.decisions["imbalanced"] += 1
        else:
            i = self._by_match(request.key, workers)
        self.tree.insert(request.key, i)
        return self._send(i)

    def _by_match(self, key: bytes, workers: Sequence[int]) -> int:
        matched, tenant = self.tree.match(key)
        rate = matched / len(key) if key else 0.0
        if rate > self.cache_threshold and tenant is not None:
            self.decisions["match"] += 1
            return tenant
        self.decisions["miss"] += 1
        return self._least_loaded(workers)

    def evict(self, now: float) -> None:
        self.tree.evict(self.max_tree_size, per_tenant=True)


class SmgCacheAware(SglangCacheAware):
    """``cache_aware`` of smg 1.13.0 with its defaults, HTTP mode.

    - **Worker overload protection** (on by default): every ``--load-monitor-interval`` (10 s)
      the router polls ``/v1/loads``; a worker whose waiting requests (summed over DP ranks)
      are ≥ ``--worker-overload-waiting-requests`` (8) or whose token usage (mean over ranks)
      is ≥ ``--worker-overload-token-usage`` (0.8) is left out of routing while another worker
      is under both; when all are over, the request goes to the least-loaded worker. (The
      package's help says "at or above"; ``--worker-overload-shed`` is off, so nothing is
      refused.)
    - **Spill gate**: a cache match goes to the matched worker unless its in-flight load
      exceeds the healthy-fleet mean by ``margin`` *and* is above ``balance_rel_threshold``
      (1.5) × the mean; then the least-loaded worker. ``margin = min(balance_abs_threshold
      (64), max(4, 2·sqrt(mean)))``: the help text caps it at "the in-flight count's natural
      swing at the pool's current mean (two standard deviations, never under four)"; the
      Poisson standard deviation sqrt(mean) is our reading of that.
    - A miss (match rate ≤ 0.3) goes to the least-loaded worker, ties to the first.
    - A matched tenant that is not routable (overloaded) falls back to the first routable
      worker without a tree insert, as the repo's ``select_worker_with_text`` does.
    - ``--max-tree-size`` bounds the *whole* tree (sum over workers), evicted LRU-first every
      ``--eviction-interval-secs`` (60).

    Not modelled: the KV-usage balance triggers (off by default at 1.0), ``--cache-ttl-secs``
    (180; agent steps return well within it), warm-up diversion, retries, circuit breaker.
    """

    name = "smg-cache_aware"
    tenant_order = "earliest"
    """smg caches the node's last tenant: its creator (``ApproxTree``)."""
    poll_interval_s: float | None = 10.0

    def __init__(
        self,
        n_workers: int,
        overload_waiting_requests: int = 8,
        overload_token_usage: float = 0.8,
        load_monitor_interval_s: float = 10.0,
        **kw: float,
    ) -> None:
        super().__init__(n_workers, **kw)  # type: ignore[arg-type]
        self.overload_waiting = overload_waiting_requests
        self.overload_usage = overload_token_usage
        self.poll_interval_s = load_monitor_interval_s
        self.overloaded = [False] * n_workers
        self.decisions.update({"spill": 0, "overload_fallback": 0, "all_overloaded": 0})

    def poll(self, now: float, loads: Sequence[Sequence[RankLoad]]) -> None:
        for i, ranks in enumerate(loads):
            if not ranks:
                continue
            waiting = sum(r.waiting_reqs for r in ranks)
            usage = sum(r.token_usage for r in ranks) / len(ranks)
            self.overloaded[i] = waiting >= self.overload_waiting or usage >= self.overload_usage

    def _spill(self, i: int) -> bool:
        mean = sum(self.loads) / self.n
        margin = min(self.abs_threshold, max(4.0, 2.0 * math.sqrt(mean)))
        load = self.loads[i]
        return load > mean + margin and load > mean * self.rel_threshold

    def select(self, request: RouteRequest) -> int:
        routable = [i for i in range(self.n) if not self.overloaded[i]]
        if not routable:
            self.decisions["all_overloaded"] += 1
            i = self._least_loaded(range(self.n))
            self.tree.insert(request.key, i)
            return self._send(i)
        matched, tenant = self.tree.match(request.key)
        rate = matched / len(request.key) if request.key else 0.0
        if rate > self.cache_threshold and tenant is not None:
            if self.overloaded[tenant]:
                self.decisions["overload_fallback"] += 1
                return self._send(routable[0])
            if self._spill(tenant):
                self.decisions["spill"] += 1
                i = self._least_loaded(routable)
            else:
                self.decisions["match"] += 1
                i = tenant
        else:
            self.decisions["miss"] += 1
            i = self._least_loaded(routable)
        self.tree.insert(request.key, i)
        return self._send(i)

    def evict(self, now: float) -> None:
        self.tree.evict(self.max_tree_size, per_tenant=False)


class Direct(Policy):
    """No router (``direct``): clients talk straight to the engines, each client slot to one of
    them (``drivers.closed_loop.run_workload`` with a list of endpoints: slot i → engine i mod n). In the
    DES a program is bound when it starts to the engine with the fewest live programs — the
    one the program that just ended used, so every engine keeps its share of the slots."""

    name = "direct"

    def __init__(self, n_workers: int) -> None:
        super().__init__(n_workers)
        self.owner: dict[str, int] = {}
        self.live = [0] * n_workers

    def select(self, request: RouteRequest) -> int:
        pid = request.program_id or ""
        i = self.owner.get(pid)
        if i is None:
            i = min(range(self.n), key=lambda k: (self.live[k], k))
            self.owner[pid] = i
            self.live[i] += 1
        return self._send(i)

    def on_release(self, program_id: str) -> None:
        i = self.owner.pop(program_id, None)
        if i is not None:
            self.live[i] -= 1


BASELINES: dict[str, type[Policy]] = {
    "direct": Direct,
    "sglang-round_robin": RoundRobin,
    "sglang-cache_aware": SglangCacheAware,
    "smg-cache_aware": SmgCacheAware,
}
"""Stock routers (and no router) by the names of ``reports.results.ALL_ROUTERS``."""


def make_baseline(name: str, n_workers: int) -> Policy:
    try:
        cls = BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline router {name!r}; valid: {sorted(BASELINES)}") from None
    return cls(n_workers)

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

Characters. Both routers' HTTP path keeps an approximate radix tree of request *text* (one node
edge per run of characters). In the DES a request is token ids, and one token id plays the role
of one character (packed 4 bytes per token). Match *rates* are unchanged by this; sizes are
not, so ``max_tree_size`` (in characters upstream) is divided by ``CHARS_PER_TOKEN``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from thunder_sgl.backends.parse import RankLoad
from thunder_sgl.sim.radix import common_prefix_bytes

CHARS_PER_TOKEN = 4
"""Characters of chat text per token (the simulator's tokenizer: just under 4)."""

MAX_TREE_SIZE_CHARS = 1 << 26
"""``--max-tree-size`` default of both routers (characters)."""


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a stock router sees of one request."""

    key: bytes
    """The routed text: here packed uint32 token ids, one token standing for one character."""
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
class _Node:
    __slots__ = ("key", "children", "tenants", "parent")

    def __init__(self, key: bytes, parent: _Node | None) -> None:
        self.key = key
        self.children: dict[bytes, _Node] = {}
        self.tenants: dict[int, int] = {}
        """tenant → last access epoch; insertion order stands for upstream's tenant choice."""
        self.parent = parent


class ApproxTree:
    """Multi-tenant radix tree of routed text (``tree.rs``): every node on an inserted path
    carries the tenant; a leaf's access epoch orders LRU eviction; a prefix match returns the
    matched length (partial edges count) and one tenant of the deepest matched node.

    Which tenant: upstream returns the node's cached "last tenant" (the tenant that created the
    node, copied on split; 0.3.2 took the first of a DashMap's iteration order). Here it is the
    earliest tenant still on the node — deterministic, and the creator whenever it remains.
    """

    def __init__(self) -> None:
        self.root = _Node(b"", None)
        self.sizes: dict[int, int] = {}
        """Tokens ("characters") per tenant, as ``tenant_char_count``."""
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
            self.sizes[tenant] = self.sizes.get(tenant, 0) + (len(node.key) >> 2)

    def insert(self, key: bytes, tenant: int) -> None:
        self.add_tenant(tenant)
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + 4])
            if child is None:
                leaf = _Node(key[pos:], node)
                node.children[key[pos : pos + 4]] = leaf
                self._claim(leaf, tenant, self._tick())
                return
            ck = child.key
            if key.startswith(ck, pos):
                self._claim(child, tenant, 0)
                node, pos = child, pos + len(ck)
                continue
            a = key[pos : pos + len(ck)]
            shared = common_prefix_bytes(a, ck[: len(a)])
            shared -= shared % 4
            mid = _Node(ck[:shared], node)  # the split keeps the child's tenants (cloned map)
            mid.tenants = dict(child.tenants)
            child.key = ck[shared:]
            child.parent = mid
            mid.children[child.key[:4]] = child
            node.children[ck[:4]] = mid
            self._claim(mid, tenant, 0)
            node, pos = mid, pos + shared
        node.tenants[tenant] = self._tick()  # the path ends on an existing node: refresh it

    def match(self, key: bytes) -> tuple[int, int | None]:
        """(matched tokens, tenant of the deepest matched node; None for an empty tree)."""
        node, pos, n = self.root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos : pos + 4])
            if child is None:
                break
            ck = child.key
            if key.startswith(ck, pos):
                node, pos = child, pos + len(ck)
                continue
            a = key[pos : pos + len(ck)]
            shared = common_prefix_bytes(a, ck[: len(a)])
            pos += shared - shared % 4
            node = child
            break
        tenant = next(iter(node.tenants), None)
        return pos >> 2, tenant

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
        ``evict_tenant_by_size``) or the whole tree (smg) holds at most ``max_size`` tokens.
        Returns tokens freed."""
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
            size = len(node.key) >> 2
            self.sizes[t] -= size
            total -= size
            freed += size
            parent = node.parent
            if parent is None:
                continue
            if not node.children and not node.tenants:
                del parent.children[node.key[:4]]
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
       most ``max_tree_size`` characters (2^26; here ``2^26 / CHARS_PER_TOKEN`` tokens).

    Simplified: no health checks, retries or circuit breaker (every worker is healthy); the
    tenant of a shared node is the earliest still on it (``ApproxTree``).
    """

    name = "sglang-cache_aware"
    eviction_interval_s: float | None = 60.0

    def __init__(
        self,
        n_workers: int,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_size: int = MAX_TREE_SIZE_CHARS // CHARS_PER_TOKEN,
        eviction_interval_s: float = 60.0,
    ) -> None:
        super().__init__(n_workers)
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.max_tree_size = max_tree_size
        self.eviction_interval_s = eviction_interval_s
        self.tree = ApproxTree()
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
        rate = matched / (len(key) >> 2) if key else 0.0
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
        rate = matched / (len(request.key) >> 2) if request.key else 0.0
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

"""Which prefix families live on which replica, and how much cache they need there (pure).

A replica's prefix cache is an LRU of fixed size. When the families routed to a
replica need more than that, they evict each other in turn and every return of an
evicted family is a cold prefill, even though each family "stays home". The
cost of placing a family is therefore not only its own uncached tokens (charged
alike everywhere) but the other families' prefixes it would push out: nothing on
a replica with room, up to its whole prefix on one already full. That marginal
overflow is what this module computes; the kvserve policy charges it.

A family counts on its replica while it was routed there within `window_s`:
families that stopped coming free their share without any eviction signal.
"""

from __future__ import annotations

from collections import OrderedDict


class Footprints:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._families: dict[str, OrderedDict[int, tuple[int, float]]] = {}  # replica -> family -> (tokens, seen)
        self._tokens: dict[str, int] = {}  # replica -> sum of its families' tokens
        self._home: dict[int, str] = {}  # family -> replica

    def record(self, family: int, replica: str, tokens: int, now: float) -> None:
        """`family` (its prefix `tokens` long) was routed to `replica` at `now`; it leaves any other replica."""
        old = self._home.get(family)
        if old is not None and old != replica:
            self._drop(old, family)
        fams = self._families.setdefault(replica, OrderedDict())
        prev = fams.pop(family, None)
        self._tokens[replica] = self._tokens.get(replica, 0) + tokens - (prev[0] if prev else 0)
        fams[family] = (tokens, now)  # most recent last
        self._home[family] = replica

    def demand(self, replica: str, now: float) -> int:
        """Prefix tokens the families living on `replica` need cached."""
        fams = self._families.get(replica)
        if not fams:
            return 0
        horizon = now - self.window_s
        while fams:
            family, (_, seen) = next(iter(fams.items()))
            if seen >= horizon:
                break
            self._drop(replica, family)
        return self._tokens.get(replica, 0)

    def overflow(self, replica: str, family: int, tokens: int, capacity: float, now: float) -> int:
        """Other families' prefix tokens that placing `family` (`tokens` long) on `replica` evicts.

        0 when the family already lives there or the replica has room; at most `tokens`.
        """
        if capacity <= 0 or self._tokens.get(replica, 0) + tokens <= capacity:
            return 0  # fits even counting families past the window (dropped lazily, when it matters)
        demand = self.demand(replica, now)
        fams = self._families.get(replica)
        if fams and family in fams:
            return 0
        return int(min(tokens, max(0.0, demand + tokens - capacity)))

    def forget_replica(self, replica: str) -> None:
        for family in self._families.pop(replica, {}):
            self._home.pop(family, None)
        self._tokens.pop(replica, None)

    def __len__(self) -> int:
        return len(self._home)

    def _drop(self, replica: str, family: int) -> None:
        tokens, _ = self._families[replica].pop(family)
        self._tokens[replica] -= tokens
        if self._home.get(family) == replica:
            del self._home[family]

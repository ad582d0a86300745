"""Which replicas a routing decision scores: the prefix holders plus a bounded random sample (pure).

Scoring every replica makes a decision cost O(replicas): ~4 ms of CPU at 1,000 replicas,
too slow for a router in front of 1,000 GPUs. Most replicas cannot win anyway: a
replica that holds none of the prompt's prefix is only as good as the least-loaded
such replica, and the best of a few random ones is nearly that (power of k choices;
with k = 16 the chance that none of them is among the 20% least-loaded is 0.8^16 ≈ 3%).

So the candidates are
- the replicas holding the prompt's prefix (from the prefix index), at most
  `sample` of them: the longest matches, a random pick among those tied at the cut;
- the replicas in `always` (the caller's own reasons: e.g. a prefix family's home);
- `sample` other replicas drawn at random: the cost model then picks the least-loaded.

When the holders and the sample together can cover every replica, every replica
is a candidate and the decision is exactly the exhaustive scorer's. `sample=None`
always scores everyone. Cost per decision: O(holders + sample), plus one C-level
copy of the replica ids for the random draw.
"""

from __future__ import annotations

import random
from collections.abc import Container, Iterable, Mapping, Sequence


def prefix_holders(matches: Mapping[str, int], routable: Container[str], limit: int, rng: random.Random) -> list[str]:
    """Routable replicas in `matches` (replica -> leading blocks held): at most `limit`, the longest matches kept.

    Holders tied at the cut are picked at random: a hot prefix cached on many replicas
    must not always offer the same few.
    """
    held = [(n, rid) for rid, n in matches.items() if n > 0 and rid in routable]
    if len(held) <= limit:
        return [rid for _, rid in held]
    held.sort(key=lambda x: (-x[0], x[1]))
    cut = held[limit - 1][0]
    keep = [rid for n, rid in held if n > cut]
    tied = sorted(rid for n, rid in held if n == cut)
    return keep + rng.sample(tied, limit - len(keep))


def candidate_ids(
    matches: Mapping[str, int],
    replica_ids: Sequence[str],
    routable: Container[str],
    sample: int | None,
    rng: random.Random,
    always: Iterable[str] = (),
) -> list[str]:
    """The replicas to score for one request, in no particular order (see the module docstring).

    `replica_ids`: every routable replica, each once; `routable`: the same set, for
    O(1) membership (a dict or set). `matches`: the prefix index's answer for this
    request. Entries of `matches` and `always` that are not routable are ignored.
    """
    n = len(replica_ids)
    if sample is None or n <= sample:
        return list(replica_ids)
    chosen = prefix_holders(matches, routable, sample, rng)
    taken = set(chosen)
    for rid in always:
        if rid not in taken and rid in routable:
            chosen.append(rid)
            taken.add(rid)
    if n - len(taken) <= sample:
        # The sample would reach every other replica: take them all, draw nothing (exhaustive).
        chosen.extend(rid for rid in replica_ids if rid not in taken)
        return chosen
    # Over-draw by the replicas already taken, so that `sample` others remain after removing them.
    drawn = 0
    for rid in rng.sample(replica_ids, min(n, sample + len(taken))):
        if rid not in taken:
            chosen.append(rid)
            drawn += 1
            if drawn == sample:
                break
    return chosen

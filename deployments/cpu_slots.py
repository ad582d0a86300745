"""Give each CPU replica on a host its own cores.

vLLM's `auto` OpenMP binding pins every engine to the same NUMA node, so two
replicas on one host fight over the same cores. A replica instead claims the
first free slot (an flock held for its lifetime; the OS releases it if the
process dies) and binds its threads to that slot's cores.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

_HELD: list = []  # keep lock files open for the life of the process


def claim_cores(cores_per_replica: int) -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    k = max(1, min(cores_per_replica, len(cores)))
    n_slots = max(1, len(cores) // k)
    lock_dir = Path(tempfile.gettempdir())
    for attempt in range(2):  # second pass: all slots taken -> share round-robin by pid
        for slot in range(n_slots):
            f = open(lock_dir / f"kvserve-cpu-slot-{slot}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            _HELD.append(f)
            return cores[slot * k : (slot + 1) * k]
    slot = os.getpid() % n_slots
    return cores[slot * k : (slot + 1) * k]


def omp_bind_value(setting: str, cpus_per_replica: float) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for this replica: `slot` claims cores, anything else passes through."""
    if setting != "slot":
        return setting
    return ",".join(map(str, claim_cores(int(max(1, cpus_per_replica)))))

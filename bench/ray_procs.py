"""The OS processes behind a live Serve app, from Ray's actor table: the ingress, each engine
replica (and its vLLM engine-core child), the Serve controller. For the fault and soak benches,
which run on the cluster's head machine (they signal and sample these pids with psutil)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import psutil

CONTROLLER = "SERVE_CONTROLLER_ACTOR"


@dataclass
class ServeProcesses:
    ingress: list[int] = field(default_factory=list)
    replicas: dict[str, int] = field(default_factory=dict)  # replica id (as in /kvserve/stats) -> actor pid
    controller: int | None = None

    def named(self) -> dict[str, int]:
        """A stable name per process: ingress, replica:<id>, controller."""
        out = {f"ingress:{i}" if len(self.ingress) > 1 else "ingress": pid for i, pid in enumerate(self.ingress)}
        out.update({f"replica:{rid}": pid for rid, pid in sorted(self.replicas.items())})
        if self.controller:
            out["controller"] = self.controller
        return out


def serve_processes(app_name: str = "kvserve") -> ServeProcesses:
    """The live actors' pids (Ray's state API on the local cluster)."""
    if "RAY_AUTH_MODE" not in os.environ and (Path.home() / ".ray" / "auth_token").exists():
        # A local cluster started with token auth (Ray's default now) keeps its token there; a
        # client process that did not start the cluster must opt in to send it.
        os.environ["RAY_AUTH_MODE"] = "token"
    from ray.util.state import list_actors

    procs = ServeProcesses()
    for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False):
        name, pid = a.name or "", a.pid
        if not pid:
            continue
        if name == CONTROLLER:
            procs.controller = pid
        elif name.startswith("SERVE_REPLICA::") and f"{app_name}#" in name:
            deployment, rid = name.split("#")[-2:]
            if deployment == "Ingress":
                procs.ingress.append(pid)
            elif deployment == "LLMReplica":
                procs.replicas[rid] = pid
    return procs


def engine_core(replica_pid: int) -> psutil.Process:
    """The vLLM engine-core process a replica started (named EngineCore by vLLM; else its biggest child)."""
    children = psutil.Process(replica_pid).children(recursive=True)
    for c in children:
        try:
            if "EngineCore" in c.name() or any("EngineCore" in part for part in c.cmdline()):
                return c
        except psutil.Error:
            continue
    live = [c for c in children if c.is_running()]
    if not live:
        raise LookupError(f"replica process {replica_pid} has no child process (no engine core)")
    return max(live, key=lambda c: c.memory_info().rss)


def tree_usage(pid: int) -> dict[str, float]:
    """RSS (MiB) and open fds of a process, and of it with its children (a replica's engine core)."""
    p = psutil.Process(pid)
    own_rss, own_fds = p.memory_info().rss, p.num_fds()
    rss, fds = own_rss, own_fds
    for c in p.children(recursive=True):
        try:
            rss += c.memory_info().rss
            fds += c.num_fds()
        except psutil.Error:
            continue
    mib = 1024 * 1024
    return {"rss_mib": round(own_rss / mib, 1), "fds": own_fds, "tree_rss_mib": round(rss / mib, 1), "tree_fds": fds}

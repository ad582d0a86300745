"""Where a server's CPU goes while a load runs: CPU seconds per process role, and py-spy stacks.

Roles come from the titles Ray and vLLM give their processes: Serve's HTTP proxy, the
kvserve Ingress and LLMReplica replicas, the Serve controller, vLLM's engine core and workers; the
server's own first process is `server` (vLLM's API server, or `kvserve serve`'s driver).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROLES = (("ray::ProxyActor", "proxy"), (":Ingress", "ingress"), (":LLMReplica", "replica"),
         ("ray::ServeController", "controller"), ("VLLM::", "engine"))  # EngineCore and its workers
PROFILED = ("server", "proxy", "ingress", "replica")  # the processes a token passes through


def role_of(title: str) -> str:
    for marker, role in ROLES:
        if marker in title:
            return role
    return "other"


def _processes(root_pid: int) -> list[tuple[str, object]]:
    """(role, psutil.Process) for the server's whole tree."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    out = []
    for p in procs:
        try:
            title = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            continue
        out.append(("server" if p.pid == root_pid else role_of(title), p))
    return out


def cpu_by_role(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process under root_pid, summed per role."""
    import psutil

    out: dict[str, float] = {}
    for role, p in _processes(root_pid):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[role] = out.get(role, 0.0) + t.user + t.system
    return out


def per_token_us(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float]:
    """CPU µs per streamed token of each role over a window (a role that appeared counts from 0)."""
    if tokens <= 0:
        return {}
    return {k: round((after[k] - before.get(k, 0.0)) * 1e6 / tokens, 1) for k in sorted(after)}


def py_spy_path() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Spies:
    """py-spy `record` (non-blocking, 100 Hz, per thread, collapsed stacks) on each profiled process.

    `--gil`: only the thread holding the GIL is sampled, so samples are Python CPU time; without it,
    threads blocked inside Ray's C++ core worker count as busy."""

    def __init__(self, root_pid: int, folder: Path, tag: str) -> None:
        spy = py_spy_path()
        if spy is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        folder.mkdir(parents=True, exist_ok=True)
        self.procs = []
        for role, p in _processes(root_pid):
            if role in PROFILED:
                out = folder / f"{tag}-{role}-{p.pid}.txt"
                self.procs.append(subprocess.Popen(
                    [spy, "record", "--pid", str(p.pid), "--rate", "100", "--nonblocking", "--threads", "--gil",
                     "--format", "raw", "--output", str(out)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # attached before the load starts

    def stop(self) -> None:
        for s in self.procs:
            s.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for s in self.procs:
            try:
                s.wait(timeout=60)
            except subprocess.TimeoutExpired:
                s.kill()

"""Start a server as a subprocess, wait until it answers, and always stop it and everything it started.

Each server runs in its own session (process group). Stopping signals the leader
(it shuts its own children down: vLLM its engine core, `kvserve serve` Ray),
waits, then SIGKILLs every process of its tree and group that is still there,
so a failed or interrupted run leaves no engine holding a port or a GPU.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens on it (TIME_WAIT leftovers do not count: servers rebind over them)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float, log: Path) -> float:
    """Poll `url` until it answers 200; seconds waited. Raises if the process dies or time runs out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready; log {log}:\n{_tail(log)}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s; log {log}:\n{_tail(log)}")


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def stop(proc: subprocess.Popen, first_signal: int, grace_s: float) -> None:
    """Signal the leader, wait up to `grace_s`, then SIGKILL what is left of its tree and its group."""
    import psutil

    tree = _tree(proc.pid)  # taken now: orphans are reparented once the leader exits
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(first_signal)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _, alive = psutil.wait_procs([p for p in tree if p.pid != proc.pid], timeout=min(grace_s, 10.0))
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)  # a SIGKILL lands asynchronously: gone (or a zombie) on return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@contextlib.contextmanager
def running(cmd: list[str], *, env: dict[str, str], ready_url: str, log: Path, timeout_s: float,
            stop_signal: int = signal.SIGTERM, grace_s: float = 60.0, cwd: str | None = None) -> Iterator[subprocess.Popen]:
    """The server, started and ready; stopped on exit however the block ends."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
    try:
        wait_ready(proc, ready_url, timeout_s, log)
        yield proc
    finally:
        stop(proc, stop_signal, grace_s)

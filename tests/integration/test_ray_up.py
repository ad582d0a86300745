"""`ray up` for real: the on-prem cluster config against 127.0.0.1 over SSH, serving the default model.

The test installs Debian's OpenSSH server (plus rsync and netcat, which `ray up` uses), runs its
own sshd on a free port with a key made for the test, renders cluster/onprem.yaml's target for
127.0.0.1, runs `ray up -y`, checks the OpenAI endpoint, then `ray down -y`.

Isolation from any other Ray on this machine (e.g. the lead's test cluster):
- sshd runs as PID 1 of a new PID namespace (`unshare --pid --mount-proc`), so everything
  started over SSH lives there: the `ray stop` inside `ray up`/`ray down` cannot see other
  processes, and killing sshd ends every process of the namespace;
- every fixed Ray port is moved to a free one, the Serve HTTP port too;
- the SSH session gets its own HOME and RAY_TMPDIR (sshd SetEnv), so no shared file is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from cluster.render import TARGETS, RayPorts, render, use_env_commands
from kvserve.config import KVServeConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
APT_PACKAGES = {"/usr/sbin/sshd": "openssh-server", "/usr/bin/rsync": "rsync", "/usr/bin/nc": "netcat-openbsd"}
UP_TIMEOUT_S = 1200


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _free_port_range(n: int, avoid: set[int]) -> int:
    """The first port of n consecutive free ports, none of them in `avoid` (Ray refuses overlaps)."""
    for base in range(20000, 60000 - n, n):
        window = range(base, base + n)
        if avoid.intersection(window):
            continue
        socks = []
        try:
            for port in window:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def _ensure_packages() -> None:
    missing = [pkg for path, pkg in APT_PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"needs {', '.join(missing)} and cannot apt-get install them here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True, env=env,
                   timeout=900)


def _wait_port(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _prepared_model_cache() -> str:
    """The default model, prepared in this process's cache (idempotent, offline once prepared)."""
    from kvserve.model import cache_root, prepare_model

    prepare_model()
    return str(cache_root())


@pytest.fixture
def sshd(tmp_path_factory) -> Iterator[dict]:
    """An sshd on 127.0.0.1:<free port> in its own PID namespace, accepting only a fresh test key."""
    if os.geteuid() != 0:
        pytest.skip("runs sshd and ssh-es in as root")
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux) to isolate the test cluster's processes")
    _ensure_packages()
    # Short path: Ray's unix sockets live under RAY_TMPDIR and must stay under 108 characters.
    work = Path(tempfile.mkdtemp(prefix="kvru-"))
    home, raytmp = work / "home", work / "tmp"
    home.mkdir()
    raytmp.mkdir()
    (home / ".bashrc").write_text("# test HOME for ray up over ssh\n")
    key = work / "id_ed25519"
    host_key = work / "host_ed25519"
    for k in (key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
    (work / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    (port,) = _free_ports(1)
    conf = work / "sshd_config"
    conf.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {work / 'sshd.pid'}",
                f"AuthorizedKeysFile {work / 'authorized_keys'}",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "AllowUsers root",
                "MaxSessions 64",
                "MaxStartups 64",
                "Subsystem sftp internal-sftp",
                f"SetEnv HOME={home} RAY_TMPDIR={raytmp}",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation dir sshd insists on
    log = (work / "sshd.log").open("w")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM", "/usr/sbin/sshd", "-D", "-e", "-f", str(conf)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_port(port)
        yield {"port": port, "key": str(key), "home": home, "raytmp": raytmp, "work": work}
    finally:
        proc.terminate()  # unshare forwards it; when the namespace's PID 1 dies, the kernel kills the rest
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        if os.environ.get("KVSERVE_KEEP_TEST_DIRS") != "1":
            shutil.rmtree(work, ignore_errors=True)


def _ray(args: list[str], cluster_yaml: Path, raytmp: Path, log: Path, timeout_s: float) -> subprocess.CompletedProcess:
    # RAY_TMPDIR isolates `ray up`'s local cluster state/lock files from any other cluster here.
    env = {**os.environ, "RAY_TMPDIR": str(raytmp), "PYTHONUNBUFFERED": "1"}
    with log.open("a") as out:
        return subprocess.run(
            [str(Path(sys.executable).parent / "ray"), *args, str(cluster_yaml)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=timeout_s,
            cwd=str(REPO),
        )


def test_ray_up_onprem_serves_the_default_model(sshd):
    target = TARGETS["onprem"]
    fixed = _free_ports(8)
    gcs, dash, client, agent, agent_grpc, rt_env, metrics, http = fixed
    # Ray's worker range must not hold any fixed port: an overlap fails `ray start` at random.
    worker_base = _free_port_range(201, set(fixed))
    ports = RayPorts(
        gcs=gcs,
        dashboard=dash,
        client_server=client,
        dashboard_agent_listen=agent,
        dashboard_agent_grpc=agent_grpc,
        runtime_env_agent=rt_env,
        metrics_export=metrics,
        min_worker=worker_base,
        max_worker=worker_base + 200,
    )
    # One CPU replica keeps this light beside other work on a 2-core machine. Explicit open mode on
    # loopback: the target's keys file would need an ./api-keys.yaml beside the test.
    cfg = KVServeConfig.model_validate(
        {**target.kvserve, "num_replicas": 1, "server": {"host": "127.0.0.1", "port": http},
         "tenants": {"open_mode": True}}
    )
    venv_bin = str(Path(sys.executable).parent)
    cluster = render(
        target,
        cfg,
        cluster_name=f"kvserve-rayup-test-{os.getpid()}",
        # Nodes use this checkout's environment instead of `pip install kvserve[cpu]` (no internet).
        setup_commands=use_env_commands(
            venv_bin, {"RAY_TMPDIR": str(sshd["raytmp"]), "KVSERVE_CACHE_DIR": _prepared_model_cache()}
        ),
        ports=ports,
        provider={"type": "local", "head_ip": "127.0.0.1", "worker_ips": []},
        auth={
            "ssh_user": "root",
            "ssh_private_key": sshd["key"],
            "ssh_proxy_command": f"nc 127.0.0.1 {sshd['port']}",  # Ray's auth has no port field
        },
    )
    cluster_yaml = sshd["work"] / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(cluster, sort_keys=False))
    log = sshd["work"] / "ray-up.log"
    try:
        up = _ray(["up", "-y", "--no-config-cache"], cluster_yaml, sshd["raytmp"], log, UP_TIMEOUT_S)
        assert up.returncode == 0, f"ray up failed:\n{log.read_text()[-6000:]}"

        base = f"http://127.0.0.1:{http}"
        models = httpx.get(f"{base}/v1/models", timeout=30)
        assert models.status_code == 200, models.text
        assert cfg.model.name in [m["id"] for m in models.json()["data"]]
        done = httpx.post(
            f"{base}/v1/completions",
            json={"model": cfg.model.name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        assert done.status_code == 200, done.text
        body = done.json()
        assert body["choices"][0]["text"].strip()
        assert body["usage"]["completion_tokens"] > 0
    finally:
        # Runs even when ray up or a check failed; the sshd fixture then ends whatever is left.
        down = _ray(["down", "-y"], cluster_yaml, sshd["raytmp"], log, 300)
    assert down.returncode == 0, f"ray down failed:\n{log.read_text()[-4000:]}"
    # After `ray down`, nothing of the test cluster answers any more.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", gcs)) != 0

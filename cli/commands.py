"""Core CLI commands: serve, deploy, status, model prepare, config show/hash-key, dashboard export/push."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import typer
import yaml
from rich.console import Console
from rich.table import Table

from deployments.auth import hash_key as _hash
from kvserve.config import ConfigError, KVServeConfig, load_config, redacted, require_servable
from kvserve.model import EMBEDDED_MODELS, embedded_model_dir, is_prepared, prepare_model

console = Console(stderr=True)
model_app = typer.Typer(no_args_is_help=True, help="Prepare and inspect models.")
config_app = typer.Typer(no_args_is_help=True, help="Show and check the effective config.")
dashboard_app = typer.Typer(no_args_is_help=True, help="The Grafana dashboard: export the JSON or push it to Grafana.")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file (env KVSERVE_<SECTION>__<FIELD> overrides it).")


def _load(config: Optional[Path], overrides: dict | None = None, serving: bool = False) -> KVServeConfig:
    """The config, or exit 2 with the reason. `serving`: it must also be safe to serve (API keys)."""
    try:
        cfg = load_config(config, overrides=overrides)
        return require_servable(cfg) if serving else cfg
    except ConfigError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    except FileNotFoundError as e:
        console.print(f"[red]config file not found: {e.filename}[/red]")
        raise typer.Exit(2) from None


def _cli_overrides(dev: bool, host: Optional[str], port: Optional[int], replicas: Optional[int],
                   policy: Optional[str], model: Optional[str]) -> dict:
    o: dict = {}
    if dev:
        o.setdefault("tenants", {})["open_mode"] = True
    if host:
        o.setdefault("server", {})["host"] = host
    if port:
        o.setdefault("server", {})["port"] = port
    if replicas:
        o["num_replicas"] = replicas
    if policy:
        o.setdefault("router", {})["policy"] = policy
    if model:
        o.setdefault("model", {})["source"] = model
    return o


def _ensure_model(cfg: KVServeConfig) -> None:
    if cfg.model.source in EMBEDDED_MODELS and not is_prepared(cfg.model.source):
        prepare(cfg.model.source, force=False)


def serve_cmd(
    config: Optional[Path] = ConfigOpt,
    dev: bool = typer.Option(False, "--dev", help="Open dev mode on loopback: no API keys, every request is tenant "
                             "`default`. Without it (or tenants.open_mode) kvserve serves only with API keys."),
    host: Optional[str] = typer.Option(None, help="Bind address (server.host)."),
    port: Optional[int] = typer.Option(None, help="HTTP port (server.port)."),
    replicas: Optional[int] = typer.Option(None, help="Fixed replica count (num_replicas)."),
    policy: Optional[str] = typer.Option(None, help="Routing policy (router.policy)."),
    model: Optional[str] = typer.Option(None, help="Model: embedded name, HF id or local path (model.source)."),
) -> None:
    """Start a local Ray cluster (or join RAY_ADDRESS), deploy, and serve until Ctrl-C / SIGTERM."""
    from cluster.local import base_url, deploy, shutdown, start_cluster

    cfg = _load(config, _cli_overrides(dev, host, port, replicas, policy, model), serving=True)
    _ensure_model(cfg)
    if cfg.tenants.open_mode:
        console.print("[bold yellow]OPEN DEV MODE[/]: no API keys are required; every request is tenant `default`. "
                      "Configure tenants.keys for production.")
    stop = threading.Event()

    def _on_signal(signum, _frame):
        console.print(f"\nreceived {signal.Signals(signum).name}, shutting down…")
        # Further signals must not interrupt the cleanup below.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    started = False
    try:
        started = start_cluster(cfg)
        with console.status("deploying…") as status:
            deploy(cfg, address=None, on_wait=lambda m: status.update(f"deploying: {m}"))
        url = base_url(cfg)
        console.print(f"[green]kvserve is serving[/] {cfg.model.name!r} on {url}/v1 "
                      f"({cfg.num_replicas if not cfg.autoscaling.enabled else 'autoscaled'} replicas, "
                      f"router={cfg.router.policy}). Ctrl-C to stop.")
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        shutdown(started)
        console.print("stopped.")


def deploy_cmd(
    config: Optional[Path] = ConfigOpt,
    address: str = typer.Option("auto", help="Ray cluster address."),
    dev: bool = typer.Option(False, "--dev", help="Open dev mode on loopback (no API keys)."),
) -> None:
    """Deploy (or redeploy) onto a running Ray cluster and return once it serves."""
    from cluster.local import deploy

    cfg = _load(config, _cli_overrides(dev, None, None, None, None, None), serving=True)
    _ensure_model(cfg)
    with console.status("deploying…") as status:
        deploy(cfg, address=address, on_wait=lambda m: status.update(f"deploying: {m}"))
    console.print(f"[green]deployed[/] {cfg.app_name}")


def status_cmd(
    url: str = typer.Option("http://127.0.0.1:8000", help="kvserve endpoint."),
    json_out: bool = typer.Option(False, "--json", help="Print raw JSON."),
) -> None:
    """Live replicas: state, ongoing requests, KV-cache usage, prefix-cache hit rate."""
    import httpx

    try:
        stats = httpx.get(url.rstrip("/") + "/kvserve/stats", timeout=10).json()["replicas"]
        ready = httpx.get(url.rstrip("/") + "/ready", timeout=10).json()
    except (httpx.HTTPError, KeyError, ValueError) as e:
        console.print(f"[red]cannot reach kvserve at {url}: {e}[/red]")
        raise typer.Exit(1) from None
    if json_out:
        print(json.dumps({"ready": ready, "replicas": stats}, indent=2))
        return
    table = Table(title=f"kvserve replicas ({ready.get('status')})")
    for col in ("replica", "state", "running", "waiting", "unfinished", "requests", "KV usage", "prefix hit rate",
                "cached blocks"):
        table.add_column(col, justify="right" if col != "replica" else "left")
    for s in stats:
        q = s.get("prefix_cache_queries", 0)
        hit = f"{s.get('prefix_cache_hits', 0) / q:.1%}" if q else "–"
        table.add_row(s["replica_id"], "RUNNING", str(s.get("running", 0)), str(s.get("waiting", 0)),
                      str(s.get("unfinished", 0)), str(s.get("num_requests", 0)), f"{s.get('kv_usage', 0):.1%}",
                      hit, str(s.get("cached_blocks", 0)))
    Console().print(table)


def prepare(name: str = typer.Argument("smollm2-135m-instruct"),
            force: bool = typer.Option(False, help="Rebuild even if prepared.")) -> None:
    """Prepare an embedded model offline (idempotent; cached under the user cache dir)."""
    if name not in EMBEDDED_MODELS:
        console.print(f"{name!r} is not embedded; vLLM will load it as a Hugging Face id or local path.")
        return
    if is_prepared(name) and not force:
        console.print(f"[green]ready[/] {embedded_model_dir(name)}")
        return
    with console.status(f"preparing {name}…") as status:
        path = prepare_model(name, progress=lambda step: status.update(f"{name}: {step}"), force=force)
    console.print(f"[green]ready[/] {path}")


def show(config: Optional[Path] = ConfigOpt,
         fmt: str = typer.Option("yaml", "--format", help="yaml or json"),
         scenario: Optional[str] = typer.Option(None, "--scenario", help="realtime-chat, offline-batch, "
                                                "long-document or edge: print the effective vLLM arguments and why.")) -> None:
    """Print the effective config (defaults < file < env), secrets masked."""
    if isinstance(scenario, str):  # (a direct call passes typer's OptionInfo default)
        from cli.scenario_report import print_report

        raise typer.Exit(print_report(config, scenario, fmt))
    data = redacted(_load(config))
    print(json.dumps(data, indent=2) if fmt == "json" else yaml.safe_dump(data, sort_keys=False), end="")


def hash_key(key: str = typer.Argument(None, help="API key; read from stdin if omitted.")) -> None:
    """Print the sha256 of an API key for `tenants.keys[].key_sha256`."""
    print(_hash(key if key is not None else sys.stdin.readline().strip()))


def profile_cmd(
    config: Optional[Path] = ConfigOpt,
    out: Path = typer.Option(Path("kvserve/profiles/cpu-smollm2-135m.json"), "--out", "-o", help="Profile JSON to write."),
    prompt_sizes: str = typer.Option("128,256,512,1024,1536", help="Prompt lengths (tokens) for prefill."),
    fractions: str = typer.Option("0,0.5,0.9", help="Cached fractions of the prompt."),
    batches: str = typer.Option("1,2,4,8,16,32", help="Running batch sizes for decode."),
    contexts: str = typer.Option("512,1536", help="Context lengths for decode."),
    reps: int = typer.Option(3, help="Repetitions per prefill point (median)."),
) -> None:
    """Measure one live engine (prefill, decode, KV capacity) and write a profile JSON."""
    from bench.engine_profile import run_profile

    cfg = _load(config)
    _ensure_model(cfg)
    nums = lambda s, f=int: [f(x) for x in s.split(",") if x.strip()]  # noqa: E731
    with console.status("profiling…") as status:
        prof = run_profile(cfg, nums(prompt_sizes), nums(fractions, float), nums(batches), nums(contexts), reps,
                           say=lambda m: (status.update(m), console.print(m)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(prof, indent=1) + "\n")
    console.print(f"[green]wrote[/] {out}")


def dashboard_export(
    config: Optional[Path] = ConfigOpt,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="File to write; `-` = stdout. Default: the chart's dashboards/kvserve.json in a "
        "source checkout, else stdout."),
) -> None:
    """Write the Grafana dashboard JSON (SLO lines from the config's `slo`)."""
    from cluster.dashboard import CHART_DASHBOARD, build_dashboard, dashboard_text

    text = dashboard_text(build_dashboard(_load(config).slo))
    if out is None and CHART_DASHBOARD.parent.is_dir():
        out = CHART_DASHBOARD
    if out is None or str(out) == "-":
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    console.print(f"[green]wrote[/] {out}")


def dashboard_push(
    url: str = typer.Option(..., help="Grafana base URL, e.g. https://grafana.example.com (user:pass@ also works)."),
    token_env: str = typer.Option("GRAFANA_TOKEN", help="Env variable holding a Grafana service-account token."),
    folder_uid: Optional[str] = typer.Option(None, help="Folder to put the dashboard in (default: General)."),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Create or overwrite the kvserve dashboard in Grafana through its HTTP API."""
    from grafana_client.client import GrafanaException

    from cluster.dashboard import build_dashboard, push

    parts = urlsplit(url)
    host = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"  # never echo user:pass from the URL
    token = os.environ.get(token_env) or None  # a token never goes on the command line (shell history)
    if token is None and not parts.password:
        console.print(f"[red]no credentials: set ${token_env} to a Grafana token or put user:pass@ in --url[/red]")
        raise typer.Exit(2)
    try:
        result = push(build_dashboard(_load(config).slo), url, token, folder_uid)
    except (GrafanaException, OSError) as e:  # niquests' errors are OSErrors
        console.print(f"[red]push to {host} failed: {e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"[green]pushed[/] {host}{result.get('url', '')}")  # Grafana's url includes any sub-path


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)
    app.command("serve")(serve_cmd)
    app.command("deploy")(deploy_cmd)
    app.command("status")(status_cmd)
    model_app.command("prepare")(prepare)
    config_app.command("show")(show)
    config_app.command("hash-key")(hash_key)
    app.add_typer(model_app, name="model")
    app.add_typer(config_app, name="config")
    dashboard_app.command("export")(dashboard_export)
    dashboard_app.command("push")(dashboard_push)
    app.add_typer(dashboard_app, name="dashboard")

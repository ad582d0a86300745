"""`kvserve` command line (typer + rich). Sub-commands owned by other rooms register themselves."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="kvserve: prefix-aware LLM serving on Ray Serve + vLLM.")


def _register_all() -> None:
    # Each room exposes `register(app)`; imports stay light (heavy deps load inside commands).
    import importlib

    for mod in ("kvserve.commands", "bench.cli", "kvserve.sim.cli"):
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and mod.startswith(e.name):
                continue  # room not present in this build
            raise
        module.register(app)


_register_all()

if __name__ == "__main__":
    app()

"""`kvserve` command line (typer + rich): one typer app, each group of commands in its own module."""

from __future__ import annotations

import typer

from cli import bench, commands, sim

app = typer.Typer(no_args_is_help=True, add_completion=False, help="kvserve: prefix-aware LLM serving on Ray Serve + vLLM.")

for _module in (commands, bench, sim):
    _module.register(app)

if __name__ == "__main__":
    app()

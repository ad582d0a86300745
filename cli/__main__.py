"""`python -m cli` runs the `kvserve` command."""

from cli.app import app

app()

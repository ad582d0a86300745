"""The `kvserve` command line (typer + rich): the top layer, above every adapter."""

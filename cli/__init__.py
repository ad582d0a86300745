"""The `kvserve` command line (typer + rich): the top layer, above every adapter.

Commands import their machinery when they run (the simulator pulls numpy, the bench an HTTP
client and plots, `serve` Ray and vLLM), so `kvserve --help` and light commands start fast.
"""

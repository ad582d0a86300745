"""Routing policies: pure Python cores (no Ray imports) plus the Ray Serve adapter in `serve_adapter`."""

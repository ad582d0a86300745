"""kvserve: prefix-aware, SLO-autoscaled LLM serving on Ray Serve + vLLM."""

__version__ = "0.1.0"

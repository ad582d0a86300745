"""kvserve: prefix-aware, SLO-autoscaled LLM serving on Ray Serve + vLLM.

This package is the ground layer: the config model, the policy cores' parameters and the
policy registry, the engine profile model, workload arrivals. It imports no other package of
this repository (README.md, "Layout").
"""

__version__ = "0.1.0"

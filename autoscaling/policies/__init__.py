"""Autoscaling policies, one per file; build them through `autoscaling.registry`."""

"""Arbiter: decides who gets which GPUs in a shared AI cluster.

The scheduling engine (`gpu_arbiter.engine`) is pure and is driven either by the trace-driven
simulator (`gpu_arbiter.sim`) or by the live control plane (`gpu_arbiter.control`).
"""

__version__ = "0.1.0"

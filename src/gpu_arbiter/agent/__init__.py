"""The node agent: finds the node's GPUs, registers them, sends heartbeats and health."""

from gpu_arbiter.agent.agent import Agent
from gpu_arbiter.agent.discovery import GpuInventory, discover

__all__ = ["Agent", "GpuInventory", "discover"]

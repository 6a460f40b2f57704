"""The trace-driven, event-driven simulator: the engine on a virtual clock."""

from gpu_arbiter.sim.economy import EconomyConfig, SimEconomy
from gpu_arbiter.sim.simulator import SimConfig, SimResult, Simulator, simulate

__all__ = ["EconomyConfig", "SimConfig", "SimEconomy", "SimResult", "Simulator", "simulate"]

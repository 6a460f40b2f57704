"""Executors that carry out the engine's decisions: local processes, Slurm, Kubernetes."""

"""Workloads as `JobSpec`s: readers for public trace formats and a seeded synthetic generator."""

"""Gavel's heterogeneity-aware max-min fairness LP (Narayanan et al., OSDI '20).

The policy is Gavel's `max_min_fairness_perf`.

An allocation gives each job `x[i, j]`, the fraction of time it should run on GPU type `j`.
The linear program it solves:

    maximise    min over jobs i of  sum_j  s_i * T[i, j] / (w_i * E_i) * x[i, j]
    subject to  sum_j x[i, j] <= 1                  (a job runs on one type at a time)
                sum_i s_i * x[i, j] <= c_j          (type j has c_j GPUs)
                x[i, j] >= 0, and 0 where T[i, j] is 0 (the job cannot run there)

`T[i, j]` is job i's throughput on type j at its size `s_i` (GPU count, the scale factor),
`w_i` its priority weight, and `E_i` its throughput under the cluster's equal split: time on
each type in proportion to the type's share of the cluster's GPUs, as Gavel normalises it. So
every job's effective throughput is measured against what an equal share of this cluster would
give it, and the objective weighs a job by its GPU count, as Gavel does (a job on s GPUs counts
s times: it needs 1/s of the time a one-GPU job needs to reach the same share).

It is solved exactly with HiGHS (`scipy.optimize.linprog`), no approximation.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix


def max_min_allocation(
    throughput: np.ndarray,
    scale: np.ndarray,
    capacity: np.ndarray,
    weight: np.ndarray | None = None,
) -> np.ndarray:
    """Time fractions `x` (jobs x types) of Gavel's max-min fairness LP (see the module).

    `throughput` is jobs x types (0: the job cannot run on the type), `scale` each job's GPU
    count, `capacity` each type's GPU count, `weight` each job's priority weight (1 if None).
    Every job must run on some type of non-zero capacity."""
    throughput = np.asarray(throughput, dtype=float)
    n, m = throughput.shape
    scale = np.asarray(scale, dtype=float)
    capacity = np.asarray(capacity, dtype=float)
    weight = np.ones(n) if weight is None else np.asarray(weight, dtype=float)
    if n == 0:
        return np.zeros((0, m))
    equal = throughput @ (capacity / capacity.sum())
    if np.any(equal <= 0):
        raise ValueError("every job needs a non-zero throughput on a type the cluster has")
    coef = throughput * (scale / (weight * equal))[:, None]
    # Variables: x row by row (job i, type j at i*m + j), then t, the minimum; minimise -t.
    nx = n * m
    cost = np.zeros(nx + 1)
    cost[-1] = -1.0
    jobs = np.repeat(np.arange(n), m)
    cells = np.arange(nx)
    rows = np.concatenate(
        [
            jobs,  # t - sum_j coef[i, j] x[i, j] <= 0
            np.arange(n),
            n + jobs,  # sum_j x[i, j] <= 1
            2 * n + np.tile(np.arange(m), n),  # sum_i s_i x[i, j] <= c_j
        ]
    )
    cols = np.concatenate([cells, np.full(n, nx), cells, cells])
    vals = np.concatenate([-coef.ravel(), np.ones(n), np.ones(nx), np.repeat(scale, m)])
    a_ub = coo_matrix((vals, (rows, cols)), shape=(2 * n + m, nx + 1)).tocsr()
    b_ub = np.concatenate([np.zeros(n), np.ones(n), capacity])
    upper = np.where(throughput.ravel() > 0, 1.0, 0.0)
    bounds = np.column_stack([np.zeros(nx + 1), np.append(upper, np.inf)])
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if result.status != 0:
        raise RuntimeError(f"Gavel's max-min LP failed: {result.message}")
    return np.clip(result.x[:nx].reshape(n, m), 0.0, 1.0)

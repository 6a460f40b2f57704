"""A tiny training job that uses the SDK: checkpoints, resumes, reports, saves on SIGTERM.

    python -m gpu_arbiter.examples.train_tiny --steps 300 --step-time 0.05 --out result.json

It fits a small linear model by SGD — with PyTorch on the CPU when torch is importable, with
numpy otherwise. Each step's mini-batch is drawn from a generator seeded by the step number, so
a run that was preempted and resumed from its checkpoint ends with exactly the weights of a run
that never stopped: the SDK's resume loses no work and repeats none. `--step-time` sleeps in
each step to stand in for GPU time. `--diverge-at STEP` raises the learning rate far past what
SGD tolerates from that step on, so the loss blows up to infinity and NaN as a real run's does:
what the control plane's circuit breakers are for.

The SDK lines are marked `# <- SDK`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpu_arbiter.sdk import Run

FEATURES = 8
DIVERGENT_LR_FACTOR = 100.0  # from --diverge-at on: far past the stable range of SGD here
TRUE_W = np.linspace(-1.0, 1.0, FEATURES)


def batch(step: int, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    x = rng.normal(size=(size, FEATURES))
    return x, x @ TRUE_W + 0.01 * rng.normal(size=size)


def numpy_step(w: np.ndarray, step: int, lr: float) -> tuple[np.ndarray, float, float]:
    """One SGD step: the new weights, the loss and the gradient norm."""
    x, y = batch(step)
    err = x @ w - y
    grad = (2 / len(y)) * (x.T @ err)
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging run overflows
        return w - lr * grad, float(np.mean(err**2)), float(np.linalg.norm(grad))


def torch_trainer(lr: float) -> Any:
    """A torch version of the same step, or None where torch is not installed."""
    try:
        import torch
    except ImportError:
        return None

    def step_fn(w: np.ndarray, step: int, lr: float = lr) -> tuple[np.ndarray, float, float]:
        x, y = (torch.from_numpy(a) for a in batch(step))
        wt = torch.from_numpy(w.copy()).requires_grad_(True)
        loss = torch.mean((x @ wt - y) ** 2)
        loss.backward()
        with torch.no_grad():
            grad_norm = float(torch.linalg.vector_norm(wt.grad))
            wt -= lr * wt.grad
        return wt.detach().numpy(), float(loss), grad_norm

    return step_fn


def train(
    steps: int,
    step_time_s: float = 0.0,
    lr: float = 0.05,
    every_s: float = 1.0,
    checkpoint_dir: str | None = None,
    backend: str = "auto",
    diverge_at: int | None = None,
) -> dict[str, Any]:
    run = Run(checkpoint_dir, every_s=every_s, report_every_s=1.0)  # <- SDK
    state = run.resume(default={"w": np.zeros(FEATURES)})  # <- SDK
    if run.resumed_from is not None:
        print(f"resumed from step {run.resumed_from}", flush=True)
    step_fn = torch_trainer(lr) if backend in ("auto", "torch") else None
    if step_fn is None and backend == "torch":
        raise SystemExit("--backend torch: torch is not installed")
    loss = float("nan")
    w = state["w"]
    for step in range(run.start_step, steps):
        rate = lr * DIVERGENT_LR_FACTOR if diverge_at is not None and step >= diverge_at else lr
        if step_fn is not None:
            w, loss, grad_norm = step_fn(w, step, rate)
        else:
            w, loss, grad_norm = numpy_step(w, step, rate)
        time.sleep(step_time_s)
        run.step(step, {"w": w}, loss=loss, grad_norm=grad_norm)  # <- SDK
    run.finish(steps - 1, {"w": w})  # <- SDK
    return {
        "steps": steps,
        "resumed_from": run.resumed_from,
        "loss": loss,
        "w": [float(v) for v in w],
        "backend": "torch" if step_fn is not None else "numpy",
        "job_id": os.environ.get("ARBITER_JOB_ID"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--every", type=float, default=1.0, help="seconds between checkpoints")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto")
    p.add_argument(
        "--diverge-at",
        type=int,
        default=None,
        metavar="STEP",
        help="from this step on, a learning rate the run diverges with (loss to inf and NaN)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the result here as JSON")
    args = p.parse_args(argv)
    result = train(
        args.steps,
        args.step_time,
        args.lr,
        args.every,
        args.checkpoint_dir,
        args.backend,
        args.diverge_at,
    )
    text = json.dumps(result)
    if args.out is not None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, args.out)
    print(text, flush=True)


if __name__ == "__main__":
    main()

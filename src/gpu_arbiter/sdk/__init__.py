"""In-job library (F6): periodic checkpoints, resume on restart, telemetry, and a final save
when the job is told it will be preempted. Needs nothing but the standard library; it talks to
Arbiter only through the REST contract (`ARBITER_*` environment variables set by the backend).

    run = Run()                                   # reads ARBITER_CHECKPOINT_DIR etc.
    state = run.resume(default=initial_state)
    for step in range(run.start_step, total_steps):
        state, loss = train_step(state)
        run.step(step, state, loss=loss)          # saves when due; saves and exits on SIGTERM
"""

from gpu_arbiter.sdk.run import PREEMPTED_EXIT_CODE, Run

__all__ = ["PREEMPTED_EXIT_CODE", "Run"]

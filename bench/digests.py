"""Decision-stream digests: the judge of every change that must keep the engine's behaviour.

    python -m bench.digests            # compare with the checked-in digests, list differences
    python -m bench.digests --write    # regenerate them (after a change meant to alter decisions)

A fixed set of runs — a synthetic workload on `medium`, two prefixes of Gavel `msr` traces and a
prefix of an Alibaba v2023 pod list, all with node and GPU failures injected — is simulated under
every policy. Every decision of every cycle (with the cycle's time) and every event the
simulator records (preemptions, failures, repairs, breaker trips) is fed, in order, to one
SHA-256 per run and policy. A refactor that keeps the digests equal makes the same decisions at
the same instants; a change that alters one decision anywhere alters the digest.

`tests/engine/test_digests.py` compares; the file `bench/digests.json` holds the digests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpu_arbiter.cli.inputs import Inputs, load_inputs
from gpu_arbiter.engine import CycleResult
from gpu_arbiter.engine.policies import POLICIES
from gpu_arbiter.sim import SimConfig
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.sim.simulator import Simulator
from gpu_arbiter.traces.base import TraceOptions

DIGESTS = Path(__file__).parent / "digests.json"
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "traces"


@dataclass(frozen=True, slots=True)
class Run:
    """One workload. `afr`: the yearly GPU and node failure rates injected, far above SPEC
    F3's so that a short run sees faults, repairs and jobs displaced by them. `hours`: where
    the clock stops (long jobs without checkpoints may restart after faults for a long time)."""

    name: str
    inputs: Callable[[], Inputs]
    afr: float
    hours: float


def _gavel(name: str, limit: int, arrival_scale: float) -> Callable[[], Inputs]:
    return lambda: load_inputs(
        "gavel:36:36:36",
        trace=FIXTURES / name,
        fmt="gavel",
        reading=TraceOptions(limit=limit),
        arrival_scale=arrival_scale,
    )


def _alibaba() -> Inputs:
    return load_inputs(
        "alibaba-v2023@0.02",
        trace=FIXTURES / "openb_pod_list_gpuspec33_head.csv",
        fmt="alibaba-v2023",
        arrival_scale=0.01,
    )


RUNS = (
    Run("synthetic-medium", lambda: load_inputs("medium", "synthetic:400", load=1.2), 40.0, 200),
    Run("gavel-msr-0e4a51", _gavel("gavel_msr_0e4a51_head.trace", 50, 0.3), 20.0, 100),
    Run("gavel-msr-7f04ca", _gavel("gavel_msr_7f04ca_head.trace", 100, 0.02), 20.0, 30),
    Run("alibaba-gpuspec33", _alibaba, 4.0, 500),
)


def _feed(h: hashlib._Hash, item: object) -> None:
    h.update(repr(item).encode())
    h.update(b"\n")


def digest(run: Run, policy: str) -> tuple[str, int]:
    """The SHA-256 of the run's decision and event stream under the policy, and how many
    decisions it holds."""
    inputs = run.inputs()
    h = hashlib.sha256()
    count = 0

    def seen(now: float, result: CycleResult) -> None:
        nonlocal count
        count += len(result.decisions)
        _feed(h, now)
        for d in result.decisions:
            _feed(h, d)

    failures = ReliabilityConfig(seed=1, gpu_afr=run.afr, node_afr=run.afr)
    config = SimConfig(max_time_s=run.hours * 3600, reliability=failures)
    sim = Simulator(inputs.cluster, inputs.teams, policy, inputs.jobs, config, on_cycle=seen)
    result = sim.run()
    for event in result.events:
        _feed(h, sorted(event.items()))
    return h.hexdigest(), count


def all_digests() -> Iterator[tuple[str, dict]]:
    for run in RUNS:
        for policy in POLICIES:
            sha, count = digest(run, policy)
            yield f"{run.name}/{policy}", {"sha256": sha, "decisions": count}


def stored() -> dict[str, dict]:
    return json.loads(DIGESTS.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.digests", description=__doc__)
    parser.add_argument("--write", action="store_true", help="regenerate bench/digests.json")
    args = parser.parse_args(argv)
    now = dict(all_digests())
    if args.write:
        DIGESTS.write_text(json.dumps(now, indent=2, sort_keys=True) + "\n")
        print(f"wrote {len(now)} digests to {DIGESTS}")
        return 0
    old = stored()
    differ = sorted(k for k in now.keys() | old.keys() if now.get(k) != old.get(k))
    for key in differ:
        print(f"{key}: stored {old.get(key)}, now {now.get(key)}")
    print(f"{len(now) - len(differ)} of {len(now)} digests equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

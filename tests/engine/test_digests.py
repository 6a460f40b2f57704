"""The decision stream of fixed runs, for every policy, is what `bench/digests.json` says.

A change that is meant to keep the engine's behaviour (a refactor, a speed-up) must keep every
digest; one meant to change decisions regenerates them (`python -m bench.digests --write`) in a
commit of its own, so the change of behaviour is visible in review.
"""

import pytest

from bench import digests


@pytest.mark.parametrize("run", digests.RUNS, ids=lambda r: r.name)
def test_decision_streams_match_the_stored_digests(run):
    stored = digests.stored()
    for policy in digests.POLICIES:
        sha, count = digests.digest(run, policy)
        assert {"sha256": sha, "decisions": count} == stored[f"{run.name}/{policy}"], policy


def test_every_run_and_policy_has_a_stored_digest():
    keys = {f"{r.name}/{p}" for r in digests.RUNS for p in digests.POLICIES}
    assert set(digests.stored()) == keys

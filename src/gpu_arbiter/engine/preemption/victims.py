"""The victim lists of a preemptor and the ONE order they are tried in (`option_key`).

Victims are tried cheapest first, by one key of numbered criteria:
1. tier, lowest tier (largest number) first; elastic jobs that can shrink come before any stop;
2. the expected wait: how long the victim keeps its GPUs after its notice (by its walltime
   estimate, it may complete first); victims stopped at once come before those that save;
3. the cost: among victims given notice (they save, so nothing is lost) the one expected to run
   longest goes first (the shortest remaining keeps running, as in SRPT); among victims stopped
   at once, the least work lost since the last checkpoint;
4. borrowed before owned;
5. the youngest run, then the latest submitted.
Lost work comes before borrowed-or-owned: taking a borrowed job that ran for days without a
checkpoint instead of an owned one that just started throws the days away.
Fractional jobs (S11) are victims only all together: a GPU that jobs of one tier alone share is
one option that stops them all, ranked as a whole job of their tier would be. A GPU shared with
a job of another tier is freed by nobody.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gpu_arbiter.domain import MILLI, Allocation, Job
from gpu_arbiter.engine.elastic import shrunk_allocation
from gpu_arbiter.engine.preemption.grace import (
    notice_given,
    notice_wait,
    shared_notice,
    shared_unsaved,
)
from gpu_arbiter.engine.sharing import shared_gpu


@dataclass(slots=True)
class VictimCache:
    """The victim lists of the cycle in progress, by (type, group, notice, save_over): each
    sorted once, when a plan first needs it, and kept current as running jobs change during
    the cycle (`VictimLists._victim_changed`, called by the state's mutators, which run
    between cycles too: then there is nothing to keep). Emptied when the cycle ends."""

    now: float = 0.0  # the time the lists were made for
    lists: dict[tuple, list[Option]] = field(default_factory=dict)
    by_job: dict[tuple, dict[str, Option]] = field(default_factory=dict)  # each list's, by id

    def begin(self, now: float) -> None:
        self.clear()
        self.now = now

    def clear(self) -> None:
        self.lists.clear()
        self.by_job.clear()


class VictimLists:
    """Victim lists per cycle, kept current as running jobs change (mixed into `Scheduler`)."""

    def _victim_groups(
        self, job: Job, t: str, within: bool, at_once: bool, now: float
    ) -> Iterator[list[Option]]:
        """The victim options of type `t` worth testing for the job, in cost order: elastic
        jobs that can shrink, then stops by tier, lowest tier first (only the tiers the policy
        may take from; none that waits out a grace when `at_once`). Each list is sorted once
        per cycle, when first needed: every plan of the cycle walks the same lists, taking
        only options still current, so a plan needing a few victims looks at a few."""
        tiers = self.policy.victim_tiers(job, within)
        if self.policy.elastic and self.elastic_running:
            yield self._victim_list(t, "shrink", 0.0, now, None)
        for k in tiers:
            grace = self._grace_of_tier(k, job)
            if at_once and grace > 0:
                continue
            if self.running_by_tier[(t, k)]:
                save_over = self._save_over(k, job, t)
                yield self._victim_list(t, k, self.notice_s(grace), now, save_over)

    def _victim_list(
        self,
        t: str,
        group: int | str,
        notice: float,
        now: float,
        save_over: tuple[float, float] | None,
    ) -> list[Option]:
        """The victim options of one group (`victim_options`), each expected to keep its GPUs
        for at most `notice` seconds (those with much unsaved work given time to save instead,
        `save_over`, see `_save_over`); for a tier whose jobs stop at once, also the GPUs that
        jobs of that tier alone share (`_shared_gpu_options`). Kept current through the cycle
        (`_victim_changed`)."""
        key = (t, group, notice, save_over)
        cache = self._victims
        options = cache.lists.get(key)
        if options is None:
            if group == "shrink":
                jobs = (v for v in self.elastic_running.values() if v.allocation.gpu_type == t)
            else:
                jobs = self.running_by_tier[(t, group)].values()
            members = (v for v in jobs if self._in_victim_group(v, group, now))
            options = victim_options(
                members, group == "shrink", notice, now, self._watts, self._reserves, save_over
            )
            if group != "shrink":
                options += self._shared_gpu_options(t, group, notice, now, save_over)
                options.sort(key=option_key)
            cache.lists[key] = options
            cache.by_job[key] = {v.id: o for o in options for v in o.jobs}
        return options

    def _shared_gpu_options(
        self, t: str, tier: int, notice: float, now: float, save_over: tuple[float, float] | None
    ) -> list[Option]:
        """The shared GPUs of type `t` (S11) on which jobs of `tier` run, each as one option
        stopping all its jobs (`_shared_gpu_option`)."""
        if not self.shared.used:
            return []  # no fractional job runs: nothing to look through
        gpus = {
            shared_gpu(v.allocation): None
            for v in self.running_by_tier[(t, tier)].values()
            if v.spec.gpu_milli < MILLI
        }
        options = (
            self._shared_gpu_option(node, gpu, tier, notice, now, save_over) for node, gpu in gpus
        )
        return [o for o in options if o is not None]

    def _shared_gpu_option(
        self,
        node: int,
        gpu: int,
        tier: int,
        notice: float,
        now: float,
        save_over: tuple[float, float] | None,
    ) -> Option | None:
        """GPU `gpu` of `node`, shared by fractional jobs, as a victim option that stops them
        all, each given `notice` (`engine.preemption.shared_gpu_option`), or None unless they
        are all of `tier` and none started in this very cycle. Stopped at once with more than
        `EngineConfig.shared_stop_max_unsaved_s` of unsaved work, they save first where
        `save_over` lets them (a tier-1 preemptor, `_save_over`), else they are no option.
        While they save the GPU is closed to newcomers (`EngineState.give_notice`). Freeing a
        whole GPU is what a preemptor needs; one of its jobs alone frees nothing."""
        sharers = self._sharers(node, gpu)
        if any(int(v.tier) != tier or v.started_at == now for v in sharers):
            return None
        watts, cap = self.shared.watts[(node, gpu)], self.cfg.shared_stop_max_unsaved_s
        save_s = save_over[1] if save_over is not None else None
        return shared_gpu_option(sharers, watts, notice, now, cap, save_s, self._reserves)

    def _sharers(self, node: int, gpu: int) -> tuple[Job, ...]:
        """The fractional jobs running on GPU `gpu` of `node`, in submission order."""
        on_node = (self.running[job_id] for job_id in self.node_jobs[node])
        sharers = [
            v
            for v in on_node
            if v.spec.gpu_milli < MILLI and shared_gpu(v.allocation) == (node, gpu)
        ]
        return tuple(sorted(sharers, key=lambda v: v.seq))

    def _victim_changed(self, job: Job) -> None:
        """A running job's borrowed flag or allocation changed during the cycle: in the victim
        lists already made for its type, put it (or its shared GPU) where a list made now would
        have it (or take it out). So a cycle's decisions do not depend on when its lists were
        first made (a dry run of the type choice can make one early)."""
        cache = self._victims
        if not cache.lists or job.allocation is None:
            return
        t, now = job.allocation.gpu_type, cache.now
        for key, options in cache.lists.items():
            if key[0] != t:
                continue
            index = cache.by_job[key]
            old = index.get(job.id)
            if old is not None:
                del options[bisect_left(options, old.key, key=option_key)]
                for v in old.jobs:
                    del index[v.id]
            group, notice, save_over = key[1:]
            new: list[Option] = []
            if self._in_victim_group(job, group, now):
                new = victim_options(
                    (job,), group == "shrink", notice, now, self._watts, self._reserves, save_over
                )
            elif job.spec.gpu_milli < MILLI and group == int(job.tier):
                shared = self._shared_gpu_option(
                    *shared_gpu(job.allocation), group, notice, now, save_over
                )
                new = [shared] if shared is not None else []
            for option in new:
                insort(options, option, key=option_key)
                for v in option.jobs:
                    index[v.id] = option


@dataclass(slots=True, eq=False)
class Option:
    """One way to free GPUs for a preemptor: stop `jobs` (one job, or every fractional job
    sharing one GPU, S11: the GPU is free only once they all stop), or shrink one elastic job
    to `kept`. It is stale once any of the jobs stopped, was resized or changed its borrowed
    flag since it was made (`current`)."""

    key: tuple  # the cost order (`option_key`), cheapest first
    jobs: tuple[Job, ...]
    kept: Allocation | None  # what a shrunk job keeps; None: the jobs stop
    part: Allocation  # the GPUs it frees
    watts: float  # the power booked for each GPU of `part`
    at_once: bool  # it frees the GPUs at once: a shrink, or jobs stopped without notice
    made_with: tuple[tuple[Allocation | None, bool], ...]  # each job's allocation and flag then

    def current(self) -> bool:
        if len(self.jobs) == 1:  # most options: one whole job
            (alloc, borrowed), v = self.made_with[0], self.jobs[0]
            return v.allocation is alloc and v.borrowed == borrowed
        return all(
            v.allocation is alloc and v.borrowed == borrowed
            for v, (alloc, borrowed) in zip(self.jobs, self.made_with, strict=True)
        )


def victim_options(
    jobs: Iterable[Job],
    shrink: bool,
    notice: float,
    now: float,
    watts: Callable[[Job], float],
    by_estimates: bool = True,
    save_over: tuple[float, float] | None = None,
) -> list[Option]:
    """The running jobs in `jobs` as victim options, cheapest first (see the module doc): shrunk
    to their minimum when `shrink` (jobs that cannot shrink are left out), else stopped, each
    expected to keep running for at most `notice` seconds after its notice (0: at once).
    `watts`: a job's power per GPU. Without `by_estimates` (a policy that does not read
    walltime estimates), victims are ranked by tier and work lost alone. `save_over`: jobs
    with much unsaved work save first instead of stopping at once (`notice_given`), and rank
    after those that stop at once."""
    options = []
    for v in jobs:
        alloc = v.allocation
        kept = shrunk_allocation(v) if shrink else None
        if shrink and kept is None:
            continue
        given = notice_given(v, notice, now, save_over)
        wait = notice_wait(v, given, now) if by_estimates else given
        # Given notice, a victim saves and loses nothing: the one expected to run longest goes
        # first (no estimate: as long as can be).
        if given > 0 and by_estimates:
            cost = now - v.expected_end_at
        else:
            cost = v.unsaved_at(now) * alloc.gpus
        key = (-int(v.tier), wait, cost, not v.borrowed, -(v.started_at or 0.0), v.seq)
        part = alloc if kept is None else _difference(alloc, kept)
        made_with = ((alloc, v.borrowed),)
        options.append(Option(key, (v,), kept, part, watts(v), given == 0, made_with))
    options.sort(key=option_key)
    return options


def shared_gpu_option(
    sharers: tuple[Job, ...],
    watts: float,
    notice: float,
    now: float,
    max_unsaved: float,
    save_s: float | None = None,
    by_estimates: bool = True,
) -> Option | None:
    """The fractional jobs sharing one GPU (S11), all of one tier, as one victim option that
    stops them all and frees the GPU (`watts`: the power booked for it), each given `notice`,
    ranked among the tier's victims as a whole job would be (`victim_options`). Stopped at once
    (`notice` 0), they cost the work they lose, each sharer's unsaved time in full (a pod loses
    all of it, whatever its share of the GPU); where that is more than `max_unsaved` seconds
    they save first, in `save_s` (`notice_given`'s rule for whole jobs), and without `save_s`
    the option is None. `by_estimates` as for `victim_options`."""
    lost = shared_unsaved(sharers, now)
    notice = shared_notice(lost, notice, max_unsaved, save_s)
    if notice is None:
        return None
    if by_estimates:
        wait = max(notice_wait(v, notice, now) for v in sharers)
        cost = lost if notice == 0 else now - max(v.expected_end_at for v in sharers)
    else:
        wait, cost = notice, lost
    youngest = max(v.started_at or 0.0 for v in sharers)
    borrowed = all(v.borrowed for v in sharers)
    tier = int(sharers[0].tier)
    key = (-tier, wait, cost, not borrowed, -youngest, min(v.seq for v in sharers))
    made_with = tuple((v.allocation, v.borrowed) for v in sharers)
    return Option(key, sharers, None, sharers[0].allocation, watts, notice == 0, made_with)


def option_key(option: Option) -> tuple:
    """The cost order of victim options (cheapest first)."""
    return option.key


def _difference(full: Allocation, kept: Allocation) -> Allocation:
    keep = {n: set(gs) for n, gs in kept.slots}
    slots = []
    for n, gs in full.slots:
        rest = tuple(g for g in gs if g not in keep.get(n, ()))
        if rest:
            slots.append((n, rest))
    return Allocation(full.gpu_type, tuple(slots))

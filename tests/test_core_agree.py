"""Property tests: the compiled core and its twin agree, and both match a naive model."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairsched.core import compiled_error, implementations
from fairsched.core._checks import MAX_TYPE_ID

IMPLS = implementations()
PY = IMPLS["py"]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def c_core():
    if IMPLS["c"] is None:
        pytest.fail(f"compiled core did not load ({compiled_error()}): run `make build`")
    return IMPLS["c"]


# Few distinct values so that ties in score, age and job id are common.
times = st.one_of(st.sampled_from([0.0, 1.0, 100.0, 320.0, 1e9]),
                  st.floats(-1e12, 1e12, allow_nan=False))
priorities = st.one_of(st.integers(0, 10), st.integers(-(1 << 62), 1 << 62))
job_ids = st.one_of(st.integers(-5, 5), st.integers(-(1 << 63), (1 << 63) - 1))
type_ids = st.integers(-2, 12)
weights = st.builds(
    PY.Weights,
    *[st.one_of(st.sampled_from([0.0, 1.0, 16.0, 1024.0]),
                st.floats(0.0, 1e6, allow_nan=False)) for _ in range(5)])
rows = st.lists(st.tuples(type_ids, priorities, times, st.booleans(), job_ids), max_size=60)
free_counts = st.lists(st.integers(-1, 9), max_size=12)
# A pool: slots with distinct ids, each of 1..4 distinct types out of 0..9, over a few workers.
slot_specs = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 4),
              st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True)),
    max_size=40, unique_by=lambda s: s[0])


def candidates(rows):
    return PY.Candidates.from_lists(*zip(*rows, strict=True)) if rows else PY.Candidates()


def build(ns, specs, busy=()):
    pool = ns.SlotPool()
    for sid, worker, types in specs:
        pool.add_slot(sid, worker, types)
    for sid in busy:
        pool.acquire_slot(sid)
    return pool


def pool_state(pool):
    return ([(s, pool.worker_of(s), pool.slot_types(s), pool.is_busy(s))
             for s in pool.slot_ids()],
            list(pool.free_counts(pool.n_type_ids + 2)), pool.n_free, len(pool))


@SETTINGS
@given(rows=rows, now=times, free=free_counts, w=weights)
def test_scores_are_bit_identical_and_order_equal(c_core, rows, now, free, w):
    cands = candidates(rows)
    c_scores, c_order = c_core.score_candidates(cands, now, free, w)
    py_scores, py_order = PY.score_candidates(cands, now, free, w)
    assert c_scores.tobytes() == py_scores.tobytes()
    assert list(c_order) == list(py_order)
    # The order is the documented one: score down, then eligible_at up, job id up, index up.
    keys = [(-py_scores[i], cands.eligible_at[i], cands.job_ids[i], i) for i in range(len(cands))]
    assert list(py_order) == sorted(range(len(cands)), key=keys.__getitem__)


# Many exact ties (equal scores, ages and job ids): runs long enough for every sorting path.
tied_rows = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.sampled_from([0.0, 5.0]),
                               st.booleans(), st.integers(0, 3)), min_size=30, max_size=300)
# Times so far apart that ages overflow to inf, and weights of 0 turn inf into NaN scores.
extreme_times = st.sampled_from([-1.7e308, -1e300, 0.0, 1e300, 1.7e308])
extreme_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), extreme_times,
                                  st.booleans(), st.integers(0, 3)), max_size=60)
zero_or_not = st.sampled_from([0.0, 1.0])


@SETTINGS
@given(rows=tied_rows, now=st.sampled_from([0.0, 2.0, 10.0]), free=free_counts)
def test_orders_agree_on_heavily_tied_candidates(c_core, rows, now, free):
    cands = candidates(rows)
    c_scores, c_order = c_core.score_candidates(cands, now, free, PY.Weights())
    py_scores, py_order = PY.score_candidates(cands, now, free, PY.Weights())
    assert c_scores.tobytes() == py_scores.tobytes()
    assert list(c_order) == list(py_order)


@SETTINGS
@given(rows=extreme_rows, now=extreme_times,
       w=st.builds(PY.Weights, zero_or_not, zero_or_not, zero_or_not, zero_or_not, zero_or_not))
def test_orders_agree_when_scores_are_infinite_or_nan(c_core, rows, now, w):
    cands = candidates(rows)
    c_scores, c_order = c_core.score_candidates(cands, now, [1, 2], w)
    py_scores, py_order = PY.score_candidates(cands, now, [1, 2], w)
    assert c_scores.tobytes() == py_scores.tobytes()
    assert list(c_order) == list(py_order)


def naive_plan(specs, busy, rows, now, w):
    """Greedy planning the slow, obvious way: scan every slot for every job."""
    slots = {sid: (types, sid in busy) for sid, _, types in specs}
    free = [sum(1 for types, b in slots.values() if t in types and not b) for t in range(10)]
    cands = candidates(rows)
    _, order = PY.score_candidates(cands, now, free, w)
    taken = set(busy)
    out = []
    for i in order:
        fits = [(len(types), sid) for sid, (types, _) in slots.items()
                if cands.types[i] in types and sid not in taken]
        if fits:
            sid = min(fits)[1]
            taken.add(sid)
            out.append((i, sid))
    return out


@SETTINGS
@given(specs=slot_specs, busy_pick=st.sets(st.integers(0, 60)), rows=rows, now=times, w=weights)
def test_plans_are_identical_and_match_the_naive_planner(c_core, specs, busy_pick, rows, now, w):
    busy = {sid for sid, _, _ in specs if sid in busy_pick}
    cands = candidates(rows)
    c_pool, py_pool = build(c_core, specs, busy), build(PY, specs, busy)
    c_idx, c_slots = c_core.plan_cycle(c_pool, cands, now, w)
    py_idx, py_slots = PY.plan_cycle(py_pool, cands, now, w)
    assert (list(c_idx), list(c_slots)) == (list(py_idx), list(py_slots))
    assert pool_state(c_pool) == pool_state(py_pool)
    assert list(zip(py_idx, py_slots, strict=True)) == naive_plan(specs, busy, rows, now, w)
    assert all(py_pool.is_busy(s) for s in py_slots)


# Small id ranges so that operations hit the same slots, workers and types again and again.
ops = st.lists(st.one_of(
    st.tuples(st.just("add_slot"), st.integers(0, 9), st.integers(0, 3),
              st.one_of(st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True),
                        st.lists(st.integers(0, 5), max_size=3))),
    st.tuples(st.just("acquire"), st.integers(-1, 6)),
    st.tuples(st.just("acquire_slot"), st.integers(0, 9)),
    st.tuples(st.just("release"), st.integers(0, 9)),
    st.tuples(st.just("remove_worker"), st.integers(0, 3)),
), min_size=20, max_size=100)


class Model:
    """The pool's contract written as plainly as possible."""

    def __init__(self):
        self.slots = {}  # slot id -> [worker, types, busy]

    def add_slot(self, sid, worker, types):
        if sid in self.slots or not types or len(set(types)) != len(types):
            return "ValueError"
        self.slots[sid] = [worker, tuple(types), False]

    def acquire(self, t):
        fits = [(len(s[1]), sid) for sid, s in self.slots.items() if t in s[1] and not s[2]]
        if not fits:
            return -1
        sid = min(fits)[1]
        self.slots[sid][2] = True
        return sid

    def acquire_slot(self, sid):
        s = self.slots.get(sid)
        if s is None or s[2]:
            return False
        s[2] = True
        return True

    def release(self, sid):
        s = self.slots.get(sid)
        if s is None or not s[2]:
            return False
        s[2] = False
        return True

    def remove_worker(self, worker):
        gone = [sid for sid, s in self.slots.items() if s[0] == worker]
        busy = sorted(sid for sid in gone if self.slots[sid][2])
        for sid in gone:
            del self.slots[sid]
        return busy

    def free_counts(self, n):
        return [sum(1 for s in self.slots.values() if t in s[1] and not s[2]) for t in range(n)]


def apply(pool, op):
    try:
        return getattr(pool, op[0])(*op[1:])
    except ValueError:
        return "ValueError"


@SETTINGS
@given(ops=ops)
def test_random_operation_sequences_agree_with_each_other_and_the_model(c_core, ops):
    c_pool, py_pool, model = c_core.SlotPool(), PY.SlotPool(), Model()
    for op in ops:
        expected = apply(model, op)
        assert apply(c_pool, op) == expected, op
        assert apply(py_pool, op) == expected, op
        counts = model.free_counts(8)
        for pool in (c_pool, py_pool):
            assert list(pool.free_counts(8)) == counts
            assert [pool.free_count(t) for t in range(8)] == counts
            assert pool.n_free == sum(1 for s in model.slots.values() if not s[2])
            assert len(pool) == len(model.slots)
            assert pool.slot_ids() == sorted(model.slots)
        assert pool_state(c_pool) == pool_state(py_pool)


@SETTINGS
@given(types=st.lists(st.integers(-3, MAX_TYPE_ID + 3), max_size=5))
def test_both_refuse_the_same_type_lists(c_core, types):
    outcome = []
    for ns in (c_core, PY):
        pool = ns.SlotPool()
        try:
            pool.add_slot(1, 1, types)
            outcome.append(pool.slot_types(1))
        except ValueError as exc:
            outcome.append(str(exc))
    assert outcome[0] == outcome[1]


# -- the candidate cache ---------------------------------------------------------------------

cache_times = st.sampled_from([0.0, 50.0, 100.0, 320.0])
# A few slots of the cache's few types, so that plans place jobs and compete for them.
cache_slot_specs = st.lists(
    st.tuples(st.integers(0, 15), st.integers(0, 3),
              st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True)),
    min_size=1, max_size=8, unique_by=lambda s: s[0])
# Mostly rows added, so that plans have candidates to choose from and compete for slots.
cache_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(-4, 12), st.integers(0, 4), st.integers(0, 1),
              cache_times, st.booleans()),
    st.tuples(st.just("add_many"),
              st.lists(st.tuples(st.integers(-4, 12), st.integers(0, 4), st.integers(0, 1),
                                 cache_times), max_size=8),
              st.booleans()),
    st.tuples(st.sampled_from(["remove", "cancel_claim", "end_claim"]), st.integers(-5, 13)),
    st.one_of(st.tuples(st.just("forget_type"), st.integers(-1, 6)),
              st.tuples(st.sampled_from(["forget_queued", "clear", "release_all"]))),
    # Without the on-demand bonus, the clock offset decides between queued and on-demand jobs.
    st.tuples(st.just("plan"), cache_times, st.sampled_from([0.0, 0.5, -30.0, 50.0]),
              st.booleans(),
              st.sampled_from(["greedy", "optimal"]),
              st.sampled_from([PY.Weights(), PY.Weights(on_demand=0.0, on_demand_age=0.0)])),
    st.tuples(st.just("release"), st.integers(0, 15)),
), min_size=10, max_size=80)


class CacheModel:
    """The candidate cache's contract written plainly: a dict of rows, planned by handing
    them to the twin's plan_cycle as Candidates."""

    def __init__(self, pool):
        self.pool = pool
        self.rows = {}  # job id -> (type, priority, eligible_at, on_demand, job)
        self.claiming = {}

    def add(self, job_id, t, p, e, od, job):
        added = job_id not in self.rows
        self.rows[job_id] = (t, p, e, bool(od), job)
        return added

    def add_many(self, job_ids, types, prios, times, jobs, on_demand=False):
        return sum(self.add(*row, on_demand, job)
                   for *row, job in zip(job_ids, types, prios, times, jobs, strict=True))

    def remove(self, job_id):
        return self.rows.pop(job_id, None) is not None

    def forget_type(self, t):
        gone = [i for i, r in self.rows.items() if not r[3] and r[0] == t]
        for i in gone:
            del self.rows[i]
        return len(gone)

    def forget_queued(self):
        gone = [i for i, r in self.rows.items() if not r[3]]
        for i in gone:
            del self.rows[i]
        return len(gone)

    def clear(self):
        self.rows.clear()

    def plan(self, now, offset, queued, matching, weights):
        ids = list(self.rows)
        rows = [self.rows[i] for i in ids]
        cands = PY.Candidates.from_lists(
            [t if queued or od else -1 for t, _, _, od, _ in rows], [r[1] for r in rows],
            [e if od else e - offset for _, _, e, od, _ in rows], [r[3] for r in rows], ids)
        idx, slots = PY.plan_cycle(self.pool, cands, now, weights, matching)
        out = ([], [], [], [])
        for i, s in zip(idx, slots, strict=True):
            row = self.rows.pop(ids[i])
            if row[3]:
                out[0].append(row[4])
                out[1].append(s)
            else:
                out[2].append(ids[i])
                out[3].append(s)
                self.claiming[ids[i]] = False
        return out

    def cancel_claim(self, job_id):
        if job_id not in self.claiming:
            return False
        self.claiming[job_id] = True
        return True

    def end_claim(self, job_id):
        return self.claiming.pop(job_id, False)

    def state(self):
        return (sorted((i, t, p, e, od) for i, (t, p, e, od, _) in self.rows.items()),
                sorted(self.claiming.items()),
                sorted(map(str, (r[4] for r in self.rows.values()))))


def cache_state(cache):
    return (cache.rows_list(), cache.claiming_list(),
            sorted(map(str, cache.jobs_of(True) + cache.jobs_of(False))))


def apply_cache_op(target, pool, op, serial):
    name, *args = op
    if name == "release":
        return pool.release(*args)
    if name == "release_all":
        return [pool.release(s) for s in pool.slot_ids()]
    if name == "add":
        job_id, t, p, e, od = args
        return target.add(job_id, t, p, e, od, f"job {job_id}.{serial}")
    if name == "add_many":
        rows, od = args
        return target.add_many([r[0] for r in rows], [r[1] for r in rows],
                               [r[2] for r in rows], [r[3] for r in rows],
                               [f"job {r[0]}.{serial}" for r in rows], on_demand=od)
    if name == "plan":
        now, offset, queued, matching, weights = args
        if isinstance(target, CacheModel):
            return tuple(map(list, target.plan(now, offset, queued, matching, weights)))
        return tuple(map(list, target.plan(pool, now, weights, offset, queued, matching)))
    return getattr(target, name)(*args)


@SETTINGS
@given(specs=cache_slot_specs, ops=cache_ops)
def test_cache_operation_sequences_agree_with_each_other_and_the_model(c_core, specs, ops):
    c_pool, py_pool, model_pool = build(c_core, specs), build(PY, specs), build(PY, specs)
    c_cache, py_cache, model = c_core.CandidateCache(), PY.CandidateCache(), CacheModel(model_pool)
    for serial, op in enumerate(ops):
        expected = apply_cache_op(model, model_pool, op, serial)
        assert apply_cache_op(c_cache, c_pool, op, serial) == expected, op
        assert apply_cache_op(py_cache, py_pool, op, serial) == expected, op
        state = model.state()
        for cache in (c_cache, py_cache):
            assert cache_state(cache) == state, op
            assert len(cache) == len(model.rows)
            assert cache.n_on_demand == sum(1 for r in model.rows.values() if r[3])
            assert [cache.queued_of(t) for t in range(7)] == [
                sum(1 for r in model.rows.values() if not r[3] and r[0] == t) for t in range(7)]
            assert cache.n_claiming == len(model.claiming)
        # Same rows in the same places: the two implementations move rows alike.
        assert c_cache.jobs_of(False) == py_cache.jobs_of(False)
        assert c_cache.jobs_of(True) == py_cache.jobs_of(True)
        assert pool_state(c_pool) == pool_state(py_pool) == pool_state(model_pool)

"""bucketing.planning.scheduler: which pending texts a continuous call runs, simulated call by call on a fake clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.planning.planner import CostModel
from bucketing.planning.scheduler import Pending, order, pick, work_us

COST = CostModel(overhead_us=2000.0, per_token_us=20.0, per_token_sq_us=0.05)
BUDGET = 8192
SLICE_MS, WAIT_MS = 30.0, 200.0


def simulate(arrivals: list[tuple[float, tuple[int, ...]]], calls: int = 10_000) -> dict[int, tuple[float, list[int]]]:
    """Run the policy over requests (arrival time, text lengths): each call takes the pick's estimated time (at
    least 1 ms). Returns, per request, when it was answered and the order its texts ran in."""
    now, pending, seen, done = 0.0, {}, 0, {}
    ran: dict[int, list[int]] = {}
    for _ in range(calls):
        while seen < len(arrivals) and arrivals[seen][0] <= now:
            pending[seen] = 0  # texts run so far
            seen += 1
        if not pending:
            if seen == len(arrivals):
                break
            now = arrivals[seen][0]
            continue
        keys = sorted(pending)
        pool = [Pending(str(k), arrivals[k][0], arrivals[k][1][pending[k] :]) for k in keys]
        chosen = pick(pool, now, COST, SLICE_MS, WAIT_MS, BUDGET)
        assert chosen.take, "every call runs at least one text"
        total = sum(n for _, n in chosen.take)
        assert total == 1 or chosen.estimated_us <= SLICE_MS * 1000
        now += max(chosen.estimated_us, 1000.0) / 1e6
        for pos, n in chosen.take:
            k = keys[pos]
            assert 1 <= n <= len(pool[pos].lengths)
            ran.setdefault(k, []).extend(range(pending[k], pending[k] + n))
            pending[k] += n
            if pending[k] == len(arrivals[k][1]):
                done[k] = (now, ran[k])
                del pending[k]
    return done


requests = st.lists(
    st.tuples(st.floats(0, 2.0), st.lists(st.integers(1, 256), min_size=1, max_size=8).map(tuple)),
    min_size=1,
    max_size=40,
).map(lambda xs: sorted(xs, key=lambda x: x[0]))


@settings(max_examples=150, deadline=None)
@given(requests)
def test_every_text_runs_exactly_once_in_its_order(arrivals):
    done = simulate(arrivals)
    assert sorted(done) == list(range(len(arrivals)))
    for k, (_, ran) in done.items():
        assert ran == list(range(len(arrivals[k][1])))


def test_a_long_request_is_not_starved_by_a_stream_of_short_ones():
    long = (0.0, (256,) * 8)
    stream = [(0.0001 * i, (6,)) for i in range(1, 10_000)]  # a 6-token query every 0.1 ms: more than a slice holds
    done = simulate(sorted([long, *stream], key=lambda x: x[0]))
    finished, _ = done[0]
    one_call = work_us([256] * 8, COST, BUDGET) / 1e6 + SLICE_MS / 1000
    assert finished <= WAIT_MS / 1000 + 8 * one_call  # overdue, it goes first until it is done
    assert finished >= WAIT_MS / 1000  # until then the short ones, shorter work, went first


def test_shortest_work_first_until_a_request_is_overdue():
    pool = [Pending("long", 0.0, (200, 200)), Pending("short", 0.05, (6,)), Pending("mid", 0.01, (40,))]
    assert order(pool, 0.1, COST, BUDGET, WAIT_MS / 1000) == [1, 2, 0]
    assert order(pool, 0.25, COST, BUDGET, WAIT_MS / 1000) == [0, 2, 1]  # overdue (over 200 ms), oldest first


def test_a_slice_takes_whole_requests_then_part_of_the_next():
    pool = [Pending("a", 0.0, (10,) * 3), Pending("b", 0.0, (100,) * 20)]
    chosen = pick(pool, 0.0, COST, 20.0, WAIT_MS, BUDGET)
    assert chosen.take[0] == (0, 3) and chosen.take[1][0] == 1 and 0 < chosen.take[1][1] < 20
    assert chosen.estimated_us <= 20_000


def test_one_text_runs_even_when_it_alone_is_over_the_slice():
    chosen = pick([Pending("a", 0.0, (256, 256))], 0.0, COST, 0.5, WAIT_MS, BUDGET)
    assert chosen.take == ((0, 1),)

"""The stage pool's ledger: processes lent and taken back, resident models grown and shrunk."""

from __future__ import annotations

import pytest

from pipeline.pure.pool import PoolLedger, Residency


def kept(name: str, *holders: int) -> Residency:
    """A model of len(holders) layers, layer i held by process holders[i]."""
    return Residency(name, tuple(f"{name}.l{i}" for i in range(len(holders))), holders)


def test_jobs_get_free_processes_first_come_and_give_them_back() -> None:
    ledger = PoolLedger(4)
    first, second = ledger.lend(1), ledger.lend(2)
    assert first is not None and second is not None
    assert (first.members, second.members) == ((0,), (1, 2))
    assert ledger.free == (3,)
    assert ledger.lend(2) is None  # not enough free: the caller asks again later
    ledger.give_back(first.job)
    third = ledger.lend(2)
    assert third is not None and third.members == (0, 3) and ledger.free == ()
    ledger.give_back(second.job)
    ledger.give_back(third.job)
    assert ledger.free == (0, 1, 2, 3)


def test_a_model_grows_onto_its_holder_and_free_joiners_with_nothing_moved_first() -> None:
    ledger = PoolLedger(4)
    parent = ledger.lend(1)
    assert parent is not None
    ledger.give_back(parent.job, kept("parent", 0, 0, 0, 0))
    child = ledger.lend(3, take="parent")
    assert child is not None
    assert child.members[0] == 0 and len(set(child.members)) == 3
    assert child.taken == kept("parent", 0, 0, 0, 0) and child.handover == {}
    assert child.handover_group == () and child.leavers == ()


def test_a_model_shrinks_onto_the_holders_of_most_layers_the_others_hand_over() -> None:
    ledger = PoolLedger(4)
    parent = ledger.lend(3)
    assert parent is not None and parent.members == (0, 1, 2)
    ledger.give_back(parent.job, kept("parent", 0, 0, 0, 1, 2, 2))
    child = ledger.lend(2, take="parent")
    assert child is not None
    assert child.members == (0, 2)  # 3 and 2 layers stay where they are
    assert child.handover == {1: 0}  # the nearest staying holder before it
    assert child.handover_group == (0, 1)
    assert child.taken is not None and child.taken.holder == (0, 0, 0, 0, 2, 2)
    assert set(ledger.free) == {3}  # the leaver is busy until it has handed over
    ledger.release(child.job, 1)
    assert set(ledger.free) == {1, 3}
    assert ledger.resident["parent"].holder == (0, 0, 0, 0, 2, 2)  # as it is held now


def test_a_leaver_before_every_staying_holder_hands_over_to_the_first_one() -> None:
    ledger = PoolLedger(3)
    job = ledger.lend(3)
    assert job is not None
    ledger.give_back(job.job, kept("m", 0, 1, 1, 2, 2))
    child = ledger.lend(2, take="m")
    assert child is not None and child.members == (1, 2) and child.handover == {0: 1}


def test_a_model_whose_holder_is_busy_is_not_taken_live() -> None:
    ledger = PoolLedger(3)
    parent = ledger.lend(2)
    assert parent is not None
    ledger.give_back(parent.job, kept("parent", 0, 1))
    other = ledger.lend(1)  # process 2 holds nothing, so it goes first
    assert other is not None and other.members == (2,)
    busy = ledger.lend(1)
    assert busy is not None and busy.members == (0,)
    child = ledger.lend(2, take="parent")
    assert child is None  # only process 1 is free
    ledger.give_back(other.job)
    child = ledger.lend(2, take="parent")
    assert child is not None and child.taken is None and set(child.members) == {1, 2}


def test_joiners_are_the_processes_holding_nothing_then_the_least_recently_used() -> None:
    ledger = PoolLedger(4, keep=4)
    for name, process in (("old", 0), ("new", 1)):
        job = ledger.lend(1)
        assert job is not None and job.members == (process,)
        ledger.give_back(job.job, kept(name, process))
    job = ledger.lend(3)
    assert job is not None and job.members == (2, 3, 0)


def test_the_least_recently_used_model_is_dropped_by_its_holders_at_their_next_lending() -> None:
    ledger = PoolLedger(2, keep=1)
    first = ledger.lend(2)
    assert first is not None
    ledger.give_back(first.job, kept("a", 0, 1))
    second = ledger.lend(1, take="a")  # shrinks 2 -> 1: process 1 hands over
    assert second is not None and second.members == (0,) and second.handover == {1: 0}
    ledger.release(second.job, 1)
    ledger.give_back(second.job, kept("b", 0))
    assert set(ledger.resident) == {"b"}
    third = ledger.lend(2)
    assert third is not None
    assert dict(third.drop) == {0: ("a",)}  # 1 handed its part over: nothing to drop there


def test_keeping_a_name_again_replaces_the_model() -> None:
    ledger = PoolLedger(2)
    for process in (0, 1):
        job = ledger.lend(1) if process == 0 else ledger.lend(2)
        assert job is not None
        ledger.give_back(job.job, kept("m", process))
    assert ledger.resident["m"].holder == (1,)
    job = ledger.lend(2)
    assert job is not None and dict(job.drop) == {0: ("m",)}


def test_a_lost_process_takes_every_model_it_held_a_part_of() -> None:
    ledger = PoolLedger(3)
    job = ledger.lend(3)
    assert job is not None
    ledger.give_back(job.job, kept("m", 0, 1, 2))
    ledger.lose([1])
    assert ledger.resident == {}
    again = ledger.lend(3)
    assert again is not None and dict(again.drop) == {0: ("m",), 2: ("m",)}


def test_bad_requests_name_the_value() -> None:
    with pytest.raises(ValueError, match="size=0"):
        PoolLedger(0)
    with pytest.raises(ValueError, match="keep=-1"):
        PoolLedger(2, keep=-1)
    ledger = PoolLedger(2)
    with pytest.raises(ValueError, match="n=3 stages cannot run on a pool of 2"):
        ledger.lend(3)
    with pytest.raises(ValueError, match="job 7 holds no processes"):
        ledger.give_back(7)
    job = ledger.lend(1)
    assert job is not None
    with pytest.raises(ValueError, match="on processes \\[1\\] it never held"):
        ledger.give_back(job.job, kept("m", 1))
    with pytest.raises(ValueError, match="process 1 is not held by job"):
        ledger.release(job.job, 1)
    with pytest.raises(ValueError, match="2 layer keys but 1 holders"):
        Residency("m", ("a", "b"), (0,))

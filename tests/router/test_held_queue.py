"""The held-request queue both transports share (router/held_queue.py): arrival order,
wake the N oldest, removal on cancellation; and the live router's asyncio waiters."""

import asyncio

import pytest

from router.held_queue import ArrivalQueue, HeldWaiters


def test_items_leave_in_arrival_order_not_push_order() -> None:
    q = ArrivalQueue()
    for name, arrival_s in [("c", 3.0), ("a", 1.0), ("d", 4.0), ("b", 2.0)]:
        q.push(name, arrival_s)
    assert list(q) == ["a", "b", "c", "d"]  # iteration leaves them queued
    assert q.peek() == "a" and len(q) == 4
    assert [q.pop() for _ in range(4)] == ["a", "b", "c", "d"]
    assert not q
    with pytest.raises(IndexError):
        q.pop()
    with pytest.raises(IndexError):
        q.peek()


def test_equal_arrivals_keep_the_order_they_were_held() -> None:
    q = ArrivalQueue()
    for name in "xyz":
        q.push(name, 5.0)
    q.push("w", 4.0)
    assert q.pop_oldest(10) == ["w", "x", "y", "z"]


def test_pop_oldest_wakes_the_n_longest_waiting() -> None:
    q = ArrivalQueue()
    for i in range(10):
        q.push(i, float(10 - i))  # 9 arrived first
    assert q.pop_oldest(3) == [9, 8, 7]
    assert len(q) == 7
    assert q.pop_oldest(0) == []
    assert q.pop_oldest(100) == [6, 5, 4, 3, 2, 1, 0]


def test_a_discarded_entry_is_never_returned() -> None:
    q = ArrivalQueue()
    tickets = {name: q.push(name, t) for name, t in [("a", 1.0), ("b", 2.0), ("c", 3.0)]}
    assert q.discard(tickets["a"]) is True
    assert q.discard(tickets["a"]) is False  # twice: no effect
    assert len(q) == 2 and q.peek() == "b"
    assert [item for _, item in q.entries()] == ["b", "c"]
    q.discard(tickets["c"])
    assert q.pop_oldest(5) == ["b"]
    assert q.discard(tickets["b"]) is False  # already popped


def test_many_cancellations_do_not_grow_the_heap_without_bound() -> None:
    q = ArrivalQueue()
    keep = q.push("kept", 0.0)
    for i in range(10_000):
        q.discard(q.push(i, float(i + 1)))
    assert len(q) == 1 and len(q._heap) <= 2 * len(q) + 65
    assert q.pop() == "kept" and q.discard(keep) is False


def test_waiters_wake_oldest_first_and_a_cancelled_one_is_skipped() -> None:
    async def scenario() -> tuple[list[str], int, int]:
        held = HeldWaiters()
        woke: list[str] = []

        async def wait(name: str, arrival_s: float) -> None:
            await held.wait(arrival_s, delay_s=3600.0)
            woke.append(name)

        tasks = {name: asyncio.create_task(wait(name, t)) for name, t in [("late", 3.0), ("first", 1.0), ("gone", 0.5),
                                                                         ("second", 2.0)]}
        await asyncio.sleep(0)  # all four are waiting
        tasks["gone"].cancel()  # its client left
        await asyncio.sleep(0)
        left_after_cancel = len(held)
        woken = held.wake(2)
        await asyncio.gather(tasks["first"], tasks["second"])
        assert not tasks["late"].done()
        woken += held.wake_all()
        await tasks["late"]
        return woke, left_after_cancel, woken

    woke, left_after_cancel, woken = asyncio.run(scenario())
    assert woke == ["first", "second", "late"]
    assert left_after_cancel == 3 and woken == 3


def test_a_waiter_returns_after_its_delay_without_a_wake() -> None:
    async def scenario() -> int:
        held = HeldWaiters()
        await held.wait(0.0, delay_s=0.01)
        return len(held)

    assert asyncio.run(scenario()) == 0

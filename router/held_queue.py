"""Held requests in arrival order: the ordering both transports share, and the live waiters.

A policy answers ``Hold(recheck_after_s)`` to a request it cannot admit yet; the transport
keeps the request and asks again later. Both transports (the live router,
:mod:`router.server`, and the simulator, :mod:`router.sim.simulator`) keep their held
requests in an :class:`ArrivalQueue`, and both keep the same contract:

1. **Arrival order.** Held requests are rechecked oldest first, by the request's
   ``arrival_s`` (ties: the order they were held). So held new sessions of one workload
   class are rechecked, and admitted, in the order they arrived: a policy that admits
   held sessions of a class in arrival order (session_admission, misa, misa_t; the
   ``Policy`` contract in :mod:`router.policies.base`) is never asked about a younger one
   first.
2. **Wake the N longest-waiting when capacity frees.** When something frees capacity (a
   request finishes, an engine recovers), the transport rechecks the ``n`` oldest held
   requests at once (:meth:`HeldWaiters.wake` live; the simulator asks each queue's head
   again), not all of them (waking every held
   request would cost O(held) decisions per finished request); the others are rechecked
   after their own ``recheck_after_s``.
3. **Cancellation.** A held request whose client went away is removed
   (:meth:`ArrivalQueue.discard`) and is never woken or forwarded; the transport reports
   it to the policy as ``RequestFinished(ok=False)`` with ``instance=""``.

The waiting itself is the transport's: the live router awaits an asyncio future per held
request (:class:`HeldWaiters`, here); the simulator re-asks the head of a queue from its
event heap (``_HeldQueue`` in :mod:`router.sim.simulator`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class ArrivalQueue(Generic[T]):
    """Items ordered by (``arrival_s``, push order), with O(1) removal by ticket.

    Transport-independent (no clock, no event loop): :meth:`push` returns a ticket,
    :meth:`discard` removes that entry (a cancelled request), :meth:`peek` / :meth:`pop`
    / :meth:`pop_oldest` give the oldest entries first. Removed entries stay in the heap
    as tombstones until they reach its top or the heap is rebuilt (when it holds more
    than twice the live entries plus 64), so every operation is O(log n) amortised.

    Example::

        q = ArrivalQueue()
        a = q.push("a", 2.0); q.push("b", 1.0); q.push("c", 3.0)
        q.discard(a)
        q.pop_oldest(5)  # ["b", "c"]
    """

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._live: dict[int, T] = {}
        self._seq = itertools.count()

    def push(self, item: T, arrival_s: float) -> int:
        """Add ``item`` that arrived at ``arrival_s`` (seconds, the transport's clock);
        returns its ticket for :meth:`discard`."""
        ticket = next(self._seq)
        heapq.heappush(self._heap, (arrival_s, ticket, item))
        self._live[ticket] = item
        return ticket

    def discard(self, ticket: int) -> bool:
        """Remove the entry of ``ticket``; False when it was already popped or removed."""
        if self._live.pop(ticket, None) is None:
            return False
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [e for e in self._heap if e[1] in self._live]
            heapq.heapify(self._heap)
        return True

    def _drop_dead_top(self) -> None:
        heap, live = self._heap, self._live
        while heap and heap[0][1] not in live:
            heapq.heappop(heap)

    def peek(self) -> T:
        """The oldest item, left in place. Raises IndexError when empty."""
        self._drop_dead_top()
        if not self._heap:
            raise IndexError("peek from an empty ArrivalQueue")
        return self._heap[0][2]

    def pop(self) -> T:
        """Remove and return the oldest item. Raises IndexError when empty."""
        self._drop_dead_top()
        if not self._heap:
            raise IndexError("pop from an empty ArrivalQueue")
        _, ticket, item = heapq.heappop(self._heap)
        del self._live[ticket]
        return item

    def pop_oldest(self, n: int) -> list[T]:
        """Remove and return the ``n`` oldest items (fewer when fewer are queued), oldest first."""
        out: list[T] = []
        while len(out) < n and self._live:
            out.append(self.pop())
        return out

    def entries(self) -> list[tuple[int, T]]:
        """``(ticket, item)`` of every queued item, oldest first (a copy: O(n log n))."""
        return [(ticket, item) for _, ticket, item in sorted(e for e in self._heap if e[1] in self._live)]

    def __iter__(self) -> Iterator[T]:
        return (item for _, item in self.entries())

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)


def _set_result_once(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class HeldWaiters:
    """The live router's held requests: one asyncio future each, in an :class:`ArrivalQueue`.

    A held request calls :meth:`wait` (sleep ``delay_s`` or until woken); :meth:`wake`
    wakes the ``n`` longest-waiting (contract 2 of the module docstring). Must be used
    from one event loop.
    """

    def __init__(self) -> None:
        self._queue: ArrivalQueue[asyncio.Future] = ArrivalQueue()

    def wake(self, n: int) -> int:
        """Wake the ``n`` held requests that arrived first (capacity was freed); returns
        how many were woken. A waiter whose timer already fired is skipped, not counted."""
        woken = 0
        queue = self._queue
        while woken < n and queue:
            fut = queue.pop()
            if not fut.done():
                fut.set_result(None)
                woken += 1
        return woken

    def wake_all(self) -> int:
        """Wake every held request (an engine came back); returns how many were woken."""
        return self.wake(len(self._queue))

    async def wait(self, arrival_s: float, delay_s: float) -> None:
        """Sleep ``delay_s`` seconds or until :meth:`wake` picks this request, whichever is first.

        Args:
            arrival_s: the request's arrival time (its place in the wake order).
            delay_s: the Hold's ``recheck_after_s`` (negative = 0).

        Raises:
            asyncio.CancelledError: the client went away (aiohttp cancels the handler); the
                request leaves the queue (contract 3). The future is awaited directly, not
                through ``asyncio.wait_for``: on Python 3.11 that returns the future's
                result and swallows the cancellation when the wake-up and the cancellation
                land in the same loop step (a finishing request wakes held ones just as
                their clients leave), and the held request would then be forwarded for
                nobody.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        ticket = self._queue.push(fut, arrival_s)
        timer = loop.call_later(max(delay_s, 0.0), _set_result_once, fut)
        try:
            await fut  # a cancellation cancels ``fut`` (or is raised at the next step if it is done)
        finally:
            timer.cancel()
            if not fut.done():
                fut.cancel()
            self._queue.discard(ticket)

    def __len__(self) -> int:
        """Held requests waiting now."""
        return len(self._queue)

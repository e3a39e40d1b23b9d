"""The event bus: events from other threads reach each queue's subscribers (those they name) in order; slow ones
are cut off."""

from __future__ import annotations

import asyncio
import threading
from typing import get_args

from queue_support import integer_batch

from invokeai.app.services.events import (
    EVENT_NAMES,
    BatchEnqueuedEvent,
    EventBase,
    EventBus,
    EventName,
    ModelInstallCancelledEvent,
    QueueItemsCanceledEvent,
    QueueItemStatusChangedEvent,
)
from invokeai.app.services.model_install_jobs import LocalModelSource
from invokeai.app.services.session_queue import SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase


def enqueued(queue_id: str, n: int) -> BatchEnqueuedEvent:
    return BatchEnqueuedEvent(queue_id=queue_id, batch_id=f"b{n}", enqueued=n, requested=n, priority=0)


async def drain(subscription, count: int | None = None) -> list[EventBase | None]:
    received: list[EventBase | None] = []
    while count is None or len(received) < count:
        event = await asyncio.wait_for(subscription.next(), timeout=5)
        received.append(event)
        if event is None:
            break
    return received


def test_subscribers_get_their_queue_events_in_order_from_another_thread() -> None:
    bus = EventBus()

    async def scenario() -> tuple[list[EventBase | None], list[EventBase | None]]:
        mine, theirs = bus.subscribe("mine"), bus.subscribe("theirs")
        publisher = threading.Thread(target=lambda: [bus.publish(enqueued("mine", n)) for n in range(1, 101)])
        publisher.start()
        bus.publish(enqueued("theirs", 7))
        got_mine = await drain(mine, 100)
        got_theirs = await drain(theirs, 1)
        publisher.join()
        return got_mine, got_theirs

    mine, theirs = asyncio.run(scenario())
    assert [e.enqueued for e in mine] == list(range(1, 101))  # type: ignore[union-attr]
    assert [e.batch_id for e in theirs] == ["b7"]  # type: ignore[union-attr]


def test_a_subscriber_that_falls_behind_is_ended_not_skipped() -> None:
    bus = EventBus(max_pending=5)

    async def scenario() -> tuple[list[EventBase | None], bool, int]:
        slow = bus.subscribe("q")
        for n in range(1, 9):
            bus.publish(enqueued("q", n))
        await asyncio.sleep(0)  # let the deliveries run
        received = await drain(slow)
        return received, slow.overflowed, bus.subscriber_count

    received, overflowed, _ = asyncio.run(scenario())
    # Five events fit; the sixth ends the stream, so the client never sees a gap.
    assert [e.enqueued if e else None for e in received] == [1, 2, 3, 4, 5, None]  # type: ignore[union-attr]
    assert overflowed


def test_close_ends_every_stream_and_later_subscriptions_at_once() -> None:
    bus = EventBus()

    async def scenario() -> tuple[list[EventBase | None], list[EventBase | None], int]:
        subscription = bus.subscribe("q")
        bus.publish(enqueued("q", 1))
        threading.Thread(target=bus.close).start()
        before = await drain(subscription)
        after = await drain(bus.subscribe("q"))
        return before, after, bus.subscriber_count

    before, after, count = asyncio.run(scenario())
    assert [e.enqueued if e else None for e in before] == [1, None]  # type: ignore[union-attr]
    assert after == [None]
    assert count == 0


def test_unsubscribe_stops_delivery_and_listeners_see_everything() -> None:
    bus = EventBus()
    heard: list[str] = []
    bus.add_listener(lambda event: heard.append(event.queue_id))

    def broken(event: EventBase) -> None:
        raise RuntimeError("a broken listener must not stop the others")

    bus.add_listener(broken)

    async def scenario() -> int:
        subscription = bus.subscribe("q")
        bus.unsubscribe(subscription)
        bus.publish(enqueued("q", 1))
        bus.publish(enqueued("r", 2))
        return bus.subscriber_count

    assert asyncio.run(scenario()) == 0
    assert heard == ["q", "r"]


def test_a_subscriber_whose_loop_is_gone_is_dropped() -> None:
    bus = EventBus()

    async def subscribe() -> None:
        bus.subscribe("q")

    asyncio.run(subscribe())  # the loop closes with the subscription still registered
    bus.publish(enqueued("q", 1))
    assert bus.subscriber_count == 0


def test_subscribers_and_listeners_that_name_events_get_only_those() -> None:
    bus = EventBus()
    heard: list[str] = []
    bus.add_listener(lambda event: heard.append(event.event_name), frozenset({"model_install_cancelled"}))
    installed = ModelInstallCancelledEvent(id=1, source=LocalModelSource(path="/m"))

    async def scenario() -> tuple[list[EventBase | None], list[EventBase | None]]:
        named = bus.subscribe("q", frozenset({"model_install_cancelled"}))
        every = bus.subscribe("q")
        bus.publish(enqueued("q", 1))
        bus.publish(installed)
        return await drain(named, 1), await drain(every, 2)

    named, every = asyncio.run(scenario())
    assert named == [installed]
    assert [event.event_name for event in every] == ["batch_enqueued", "model_install_cancelled"]  # type: ignore[union-attr]
    assert heard == ["model_install_cancelled"]


def test_is_wanted_says_whether_an_event_would_reach_anyone() -> None:
    bus = EventBus()
    progress = "invocation_progress"
    assert not bus.is_wanted(progress, "q")
    bus.add_listener(lambda event: None, frozenset({"batch_enqueued"}))
    assert not bus.is_wanted(progress, "q") and bus.is_wanted("batch_enqueued", "q")

    async def scenario() -> list[bool]:
        answers = []
        named = bus.subscribe("q", frozenset({"queue_item_status_changed"}))
        answers += [bus.is_wanted(progress, "q"), bus.is_wanted("queue_item_status_changed", "q")]
        other = bus.subscribe("other")  # every event, of another queue
        answers += [bus.is_wanted(progress, "q"), bus.is_wanted(progress, "other"), bus.is_wanted(progress, None)]
        bus.unsubscribe(other)
        bus.unsubscribe(named)
        answers.append(bus.is_wanted("queue_item_status_changed", "q"))
        return answers

    assert asyncio.run(scenario()) == [False, True, False, True, True, False]
    bus.add_listener(lambda event: None)
    assert bus.is_wanted(progress, "q")


def test_the_names_a_request_may_give_are_the_events_names() -> None:
    assert get_args(EventName) == EVENT_NAMES


def test_one_bulk_cancel_clear_or_prune_fits_in_a_stream_that_has_not_read_yet(db: SqliteDatabase) -> None:
    # The queue's methods run on the loop's own thread here, so nothing is read until they all return: each
    # request's events must fit whole into what a stream may hold, however quickly its client reads.
    bus = EventBus()
    queue = SessionQueue(db, bus, max_queue_size=5000)

    async def scenario() -> tuple[list[int], list[list[EventBase | None]], list[bool]]:
        subscriptions = [bus.subscribe("default"), bus.subscribe("default")]
        ids = queue.enqueue_batch("default", integer_batch(runs=1500)).item_ids
        queue.cancel_by_batch_ids("default", [queue.get("default", ids[0]).batch_id])
        queue.prune("default")
        queue.enqueue_batch("default", integer_batch(runs=1500))
        queue.clear("default")
        bus.close()
        received = [await drain(subscription) for subscription in subscriptions]
        return ids, received, [subscription.overflowed for subscription in subscriptions]

    ids, received, overflowed = asyncio.run(scenario())
    assert overflowed == [False, False]
    for events in received:
        assert events[-1] is None  # ended by close(), not before
        canceled = [
            item_id
            for event in events
            if event is not None
            for item_id in (
                event.item_ids
                if isinstance(event, QueueItemsCanceledEvent)
                else [event.item_id]
                if isinstance(event, QueueItemStatusChangedEvent) and event.status == "canceled"
                else []
            )
        ]
        assert canceled == ids
        assert [e.event_name for e in events if e is not None and e.event_name.startswith(("queue_c", "queue_p"))] == [
            "queue_pruned",
            "queue_cleared",
        ]

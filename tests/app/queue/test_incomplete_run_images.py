"""The images of a queue run that did not complete: written by an item that then failed, was canceled, or was
interrupted and put back to run again. They are marked in their record by the item's status change, left out of the
image lists unless asked for, and removed (records and files) by the queue's prune; a completed run's images are
never touched. On both engines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_support import ENGINES
from PIL import Image
from queue_support import EventRecorder, integer_batch, wait_until

from invokeai.app.nodes.context import InvocationContext
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
from invokeai.app.services.database import Database
from invokeai.app.services.events import EventBus
from invokeai.app.services.images import ImageFilters, ImageService
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue


def _script(monkeypatch: pytest.MonkeyPatch, run: Callable[[IntegerInvocation, InvocationContext], None]) -> None:
    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        run(self, context)
        return IntegerOutput(value=self.value)

    IntegerInvocation.output_class()
    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)


def _listed(images: ImageService, include: bool) -> set[str]:
    return set(images.names(ImageFilters(include_incomplete_runs=include)).image_names)


def _files(images: ImageService) -> set[str]:
    return {path.name for path in images.outputs_dir.glob("*.png")}


@pytest.mark.parametrize("ending", ["failed", "canceled", "requeued and run again"])
@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_an_incomplete_runs_images_are_marked_unlisted_and_pruned(
    db: Database, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ending: str
) -> None:
    # Item `done` completes with its image. Item `broken` writes an image and then does not complete: it fails, is
    # canceled while running, or (its server stopped past its lease) is put back as pending and completes on a
    # rerun, which writes an image of its own.
    waiting, go_on = threading.Event(), threading.Event()
    runs: list[int] = []

    def run(node: IntegerInvocation, context: InvocationContext) -> None:
        runs.append(context.item_id)
        context.save_image(Image.new("RGB", (8, 8), "red"))
        if node.value == 1 and runs.count(context.item_id) == 1:  # the broken item's first run
            if ending == "failed":
                raise RuntimeError("failed after its image")
            waiting.set()
            assert go_on.wait(10)
            context.check_canceled()

    _script(monkeypatch, run)
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    images = ImageService(db, tmp_path / "out", 1 << 20)
    requeue = ending == "requeued and run again"
    queue = SessionQueue(db, events, 100, lease_seconds=0.5, requeue_interrupted=requeue, images=images)
    sweeper = SessionQueue(db, EventBus(), 100, requeue_interrupted=requeue, server="other:1")
    processor = SessionProcessor(queue, images, events, poll_seconds=0.05)
    (done,) = queue.enqueue_batch("default", integer_batch(0)).item_ids
    (broken,) = queue.enqueue_batch("default", integer_batch(1)).item_ids
    processor.start()
    try:
        recorder.wait_status(done, "completed")
        if ending == "canceled":
            assert waiting.wait(10)
            queue.cancel("default", broken)
        elif requeue:
            assert waiting.wait(10)
            time.sleep(0.6)  # past the lease, never renewed: no lease keeper runs
            assert sweeper.recover_expired() == 1
        go_on.set()
        final = "completed" if requeue else ending
        wait_until(lambda: queue.get("default", broken).status == final, timeout=10, what=f"the item {final}")
        wait_until(lambda: not processor.workers()[0].busy, timeout=10, what="the worker to be idle")
    finally:
        go_on.set()
        processor.stop()
    records = db.execute("SELECT image_name, queue_item_id, of_incomplete_run FROM images ORDER BY rowid")
    by_item = {(row["queue_item_id"], bool(row["of_incomplete_run"])): row["image_name"] for row in records}
    assert sorted(by_item) == sorted([(done, False), (broken, True), *([(broken, False)] if requeue else [])])
    incomplete = by_item[(broken, True)]
    assert images.get_dto(incomplete).of_incomplete_run  # still served to a client that names it
    kept = {name for (_, marked), name in by_item.items() if not marked}
    assert _listed(images, include=False) == kept
    assert _listed(images, include=True) == kept | {incomplete}
    assert images.list(filters=ImageFilters())[1] == len(kept)

    queue.prune("default")
    assert {row["image_name"] for row in db.execute("SELECT image_name FROM images")} == kept
    assert _files(images) == kept
    if requeue:  # the rerun completed: pruned with its item, its image stays
        assert queue.counts_by_status("default")["completed"] == 0


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_cancel_of_an_item_that_never_ran_or_of_another_item_marks_nothing(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mark follows the queue item that wrote the image, not its session or the images around it: an upload
    # naming the item's session, and a completed item's image, stay listed when other items are canceled.
    def run(node: IntegerInvocation, context: InvocationContext) -> None:
        context.save_image(Image.new("RGB", (4, 4)))

    _script(monkeypatch, run)
    images = ImageService(db, tmp_path / "out", 1 << 20)
    events = EventBus()
    recorder = EventRecorder()
    events.add_listener(recorder)
    queue = SessionQueue(db, events, 100, images=images)
    processor = SessionProcessor(queue, images, events, poll_seconds=0.05)
    (ran,) = queue.enqueue_batch("default", integer_batch()).item_ids
    processor.start()
    try:
        recorder.wait_status(ran, "completed")
    finally:
        processor.stop()
    (pending,) = queue.enqueue_batch("default", integer_batch()).item_ids
    pending_session = queue.get("default", pending).session_id
    uploaded = images.save(Image.new("RGB", (4, 4)), origin="uploaded", session_id=pending_session)
    queue.cancel("default", pending)
    queue.prune("default")
    assert len(_listed(images, include=False)) == 2
    assert uploaded.image_name in _listed(images, include=False)
    assert len(_files(images)) == 2

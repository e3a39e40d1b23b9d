"""What a running node may use: the images service, the model manager, the tensor store, progress reports and the
cancel flag of its queue item."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PIL import Image

from invokeai.app.nodes.fields import ImageField

if TYPE_CHECKING:
    from invokeai.app.services.images import ImageService
    from invokeai.app.services.model_manager import ModelManager
    from invokeai.app.services.tensors import TensorStore


class CanceledError(Exception):
    """The queue item was canceled; raised inside a node at its next check so that it stops early."""


class InvocationContext:
    """Built by the session processor for each node it runs."""

    def __init__(
        self,
        *,
        queue_id: str,
        item_id: int,
        session_id: str,
        node_id: str,
        node_type: str,
        graph: dict[str, Any],
        images: ImageService,
        workflow: str | None = None,
        is_intermediate: bool = False,
        on_progress: Callable[[int, int, Callable[[], Image.Image] | None], None],
        is_canceled: Callable[[], bool],
        models: ModelManager | None = None,
        tensors: TensorStore | None = None,
        fence: Callable[[Any], None] | None = None,
    ) -> None:
        """fence: checks, inside the transaction of an image's record, that the queue item is still this run's
        (the queue's Fence); None outside a queue run."""
        self.queue_id = queue_id
        self.item_id = item_id
        self.session_id = session_id
        self.node_id = node_id
        self.node_type = node_type
        self.graph = graph
        self.workflow = workflow
        self.is_intermediate = is_intermediate
        self.images = images
        self._on_progress = on_progress
        self._is_canceled = is_canceled
        self._models = models
        self._tensors = tensors
        self._fence = fence

    @property
    def models(self) -> ModelManager:
        if self._models is None:
            raise RuntimeError(f"node {self.node_id!r} ({self.node_type}) needs models, but this context has none")
        return self._models

    @property
    def tensors(self) -> TensorStore:
        if self._tensors is None:
            raise RuntimeError(
                f"node {self.node_id!r} ({self.node_type}) needs the tensor store; this context has none"
            )
        return self._tensors

    def check_canceled(self) -> None:
        if self._is_canceled():
            raise CanceledError(f"canceled while running node {self.node_id!r} ({self.node_type})")

    def progress(self, step: int, total: int, preview: Callable[[], Image.Image] | None = None) -> None:
        """Report a step; a canceled item stops here rather than after the remaining steps. `preview` makes the
        step's preview image; it is called only while a client watches the progress events."""
        self.check_canceled()
        self._on_progress(step, total, preview)

    def save_image(
        self, image: Image.Image, metadata: dict[str, Any] | None = None, board_id: str | None = None
    ) -> ImageField:
        """Store a generated image, recorded with the session and node that made it, with the graph, the batch's
        workflow and `metadata` (the generation's settings: InvokeAI's core_metadata) embedded in the PNG. An
        image of a node marked is_intermediate is kept out of the gallery's lists, as InvokeAI does. board_id: the
        board it goes on (one that exists), or None."""
        record = self.images.save(
            image,
            origin="generated",
            session_id=self.session_id,
            node_id=self.node_id,
            metadata=metadata,
            workflow=self.workflow,
            graph=self.graph,
            is_intermediate=self.is_intermediate,
            board_id=board_id,
            fence=self._fence,
            queue_item_id=self.item_id,
        )
        return ImageField(image_name=record.image_name)

    def load_image(self, field: ImageField) -> Image.Image:
        return self.images.get_pil(field.image_name)

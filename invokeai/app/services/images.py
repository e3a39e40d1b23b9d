"""Images: PNG files under outputs_dir, each with a record in the database; the only way in and out for image data."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any, Literal

from PIL import Image, ImageOps, PngImagePlugin, UnidentifiedImageError
from pydantic import BaseModel, Field

from invokeai.app.services.database import Database, Row
from invokeai.app.services.owned_temporaries import temporary_name
from invokeai.app.services.timestamps import now_iso

# Names are generated here (uuid4 hex); anything else cannot name a stored image, which is what keeps paths
# built from client input inside outputs_dir.
IMAGE_NAME_PATTERN = re.compile(r"^[0-9a-f]{32}\.png$")
# The PNG text chunks InvokeAI writes, so that its clients (and anything reading its images) read these the same:
# the generation's settings (core_metadata), the workflow a client sent with the batch, and the graph that ran.
METADATA_KEY = "invokeai_metadata"
WORKFLOW_KEY = "invokeai_workflow"
GRAPH_KEY = "invokeai_graph"
THUMBNAIL_SIZE = 256
THUMBNAILS_DIR = "thumbnails"
# Files being written are named so; one left by a kill mid-write is never a recorded image.
TEMPORARY_PREFIX = ".tmp-"
# Pillow's messages can name the file object it was given ("<_io.BytesIO object at 0x...>"), which says nothing to
# a client.
_OBJECT_REPR = re.compile(r"<[^<>]* object at 0x[0-9A-Fa-f]+>")
# An upload's decoded size is bounded as well as its byte count: a small compressed file can expand enormously.
DEFAULT_MAX_UPLOAD_PIXELS = 8192 * 8192

Origin = Literal["generated", "uploaded"]
# InvokeAI's image categories: what the image is for (user uploads, masks, control images...).
ImageCategory = Literal["general", "mask", "control", "user", "other"]


class ImageRecord(BaseModel):
    image_name: str = Field(description="The server-generated name of the image")
    width: int = Field(description="Width in pixels")
    height: int = Field(description="Height in pixels")
    created_at: str = Field(description="When the image was stored (ISO 8601, UTC)")
    origin: Origin = Field(description="Made by a node, or uploaded by a client")
    session_id: str | None = Field(default=None, description="The session whose graph made the image")
    node_id: str | None = Field(default=None, description="The node that made the image")
    image_category: ImageCategory = Field(default="general", description="What the image is for, as InvokeAI's")
    is_intermediate: bool = Field(
        default=False, description="A step of a graph rather than its result: kept out of the gallery's lists"
    )
    has_workflow: bool = Field(default=False, description="Whether a workflow was stored with the image")


class ImageNotFoundError(KeyError):
    def __init__(self, name: object) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"image {self.name!r} not found"


class UnsupportedImageError(ValueError):
    pass


class ImageTooLargeError(ValueError):
    pass


def _png_ready(image: Image.Image) -> Image.Image:
    """The image in a mode PNG stores faithfully (keeping transparency where there is any)."""
    if image.mode in ("RGB", "RGBA", "L", "LA", "I;16", "1"):
        return image
    # Not "A" in getbands(): LAB's second band is a colour axis, not alpha.
    return image.convert("RGBA" if image.has_transparency_data else "RGB")


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write through a temporary file in the same folder, so that readers never see half a file.

    Created with mode 0666 less the umask, as any file the process writes: tempfile.mkstemp would make it 0600,
    and the image would keep that mode after the rename. Named with this host and process: outputs_dir may be shared
    by several servers, and one starting up must tell a live server's write from a dead one's leftover."""
    tmp = path.parent / temporary_name(TEMPORARY_PREFIX, path.suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _row_to_record(row: Row) -> ImageRecord:
    return ImageRecord(
        image_name=row["image_name"],
        width=row["width"],
        height=row["height"],
        created_at=row["created_at"],
        origin=row["origin"],
        session_id=row["session_id"],
        node_id=row["node_id"],
        image_category=row["image_category"],
        is_intermediate=bool(row["is_intermediate"]),
        has_workflow=bool(row["has_workflow"]),
    )


_STORED_COLUMNS = "image_name, width, height, created_at, origin, session_id, node_id, image_category, is_intermediate"
_RECORD_COLUMNS = f"{_STORED_COLUMNS}, workflow IS NOT NULL AS has_workflow"


class ImageService:
    def __init__(
        self,
        db: Database,
        outputs_dir: Path,
        max_upload_bytes: int,
        max_upload_pixels: int = DEFAULT_MAX_UPLOAD_PIXELS,
    ) -> None:
        self._db = db
        self.outputs_dir = outputs_dir.resolve()
        self.max_upload_bytes = max_upload_bytes
        self.max_upload_pixels = max_upload_pixels
        self._thumbnails_dir = self.outputs_dir / THUMBNAILS_DIR
        self._thumbnails_dir.mkdir(parents=True, exist_ok=True)

    # -- storing --------------------------------------------------------------------------------------------

    def save(
        self,
        image: Image.Image,
        *,
        origin: Origin = "generated",
        session_id: str | None = None,
        node_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        workflow: str | None = None,
        graph: dict[str, Any] | None = None,
        image_category: ImageCategory = "general",
        is_intermediate: bool = False,
    ) -> ImageRecord:
        """Store `image` as a new PNG and record it. Each of `metadata` (the generation's settings, JSON), `workflow`
        (a client's workflow, JSON text kept as sent) and `graph` goes in the PNG text chunk InvokeAI names for it,
        and in the record."""
        if origin not in ("generated", "uploaded"):
            raise ValueError(f"origin must be 'generated' or 'uploaded', not {origin!r}")
        image = _png_ready(image)
        name = f"{uuid.uuid4().hex}.png"
        metadata_json = json.dumps(metadata, default=str) if metadata is not None else None
        graph_json = json.dumps(graph, default=str) if graph is not None else None
        pnginfo = PngImagePlugin.PngInfo()
        for key, text in ((METADATA_KEY, metadata_json), (WORKFLOW_KEY, workflow), (GRAPH_KEY, graph_json)):
            if text is not None:
                # iTXt (UTF-8): a prompt may hold any character, and tEXt is Latin-1.
                pnginfo.add_itxt(key, text)
        path = self.outputs_dir / name
        _atomic_write(path, lambda handle: image.save(handle, format="PNG", pnginfo=pnginfo))
        record = ImageRecord(
            image_name=name,
            width=image.width,
            height=image.height,
            created_at=now_iso(),
            origin=origin,
            session_id=session_id,
            node_id=node_id,
            image_category=image_category,
            is_intermediate=is_intermediate,
            has_workflow=workflow is not None,
        )
        try:
            with self._db.transaction() as cursor:
                cursor.execute(
                    f"INSERT INTO images ({_STORED_COLUMNS}, metadata, workflow, graph) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.image_name,
                        record.width,
                        record.height,
                        record.created_at,
                        record.origin,
                        record.session_id,
                        record.node_id,
                        record.image_category,
                        record.is_intermediate,
                        metadata_json,
                        workflow,
                        graph_json,
                    ),
                )
        except BaseException:
            # A file without a record could never be served or deleted; don't leave one.
            path.unlink(missing_ok=True)
            raise
        return record

    def upload(
        self,
        data: bytes,
        filename: str | None,
        *,
        image_category: ImageCategory = "user",
        is_intermediate: bool = False,
    ) -> ImageRecord:
        """Store a client's image, re-encoded as PNG. Nothing is stored unless it decodes completely."""
        if len(data) > self.max_upload_bytes:
            raise ImageTooLargeError(f"the upload is {len(data)} bytes; the limit is {self.max_upload_bytes}")
        image = self._decode(data)
        metadata = {"uploaded_filename": filename[:255]} if filename else None
        return self.save(
            image, origin="uploaded", metadata=metadata, image_category=image_category, is_intermediate=is_intermediate
        )

    def _decode(self, data: bytes) -> Image.Image:
        try:
            # verify() reads the whole file to check its structure but leaves the image unusable; open it again.
            with Image.open(BytesIO(data)) as probe:
                probe.verify()
            image = Image.open(BytesIO(data))
            # The header's size is known before any pixel is decoded; refuse bombs before they expand.
            if image.width * image.height > self.max_upload_pixels:
                raise ImageTooLargeError(
                    f"the image is {image.width}x{image.height} pixels; the limit is {self.max_upload_pixels} pixels"
                )
            image.load()
            return ImageOps.exif_transpose(image)
        except ImageTooLargeError:
            raise
        except Image.DecompressionBombError as error:
            raise ImageTooLargeError(str(error)) from error
        except UnidentifiedImageError:
            raise UnsupportedImageError(
                "not a readable image: its data is in none of the image formats the server reads (PNG, JPEG, WEBP, "
                "GIF, BMP, TIFF and the others Pillow decodes)"
            ) from None
        except Exception as error:
            # Pillow reports broken data as many different exception types (OSError, SyntaxError, ValueError...).
            message = _OBJECT_REPR.sub("the upload", str(error)) or type(error).__name__
            raise UnsupportedImageError(f"not a readable image: {message}") from error

    # -- reading --------------------------------------------------------------------------------------------

    def get_record(self, name: str) -> ImageRecord:
        if not isinstance(name, str) or not IMAGE_NAME_PATTERN.match(name):
            raise ImageNotFoundError(name)
        rows = self._db.execute(f"SELECT {_RECORD_COLUMNS} FROM images WHERE image_name = ?", (name,))
        if not rows:
            raise ImageNotFoundError(name)
        return _row_to_record(rows[0])

    def get_metadata(self, name: str) -> dict[str, Any] | None:
        """The metadata stored with the image (the same JSON as in the PNG), or None."""
        self.get_record(name)
        rows = self._db.execute("SELECT metadata FROM images WHERE image_name = ?", (name,))
        raw = rows[0]["metadata"] if rows else None
        return json.loads(raw) if raw is not None else None

    def list(
        self, offset: int = 0, limit: int = 50, *, is_intermediate: bool | None = None
    ) -> tuple[list[ImageRecord], int]:
        """One page of records, newest first, and the total number of images (of those `is_intermediate` picks,
        when given)."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        where, params = ("WHERE is_intermediate = ?", (is_intermediate,)) if is_intermediate is not None else ("", ())
        # rowid: SQLite's insertion order; on PostgreSQL a column of that name (see migration 1).
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM images {where}", params)[0]["n"])
            rows = self._db.execute(
                f"SELECT {_RECORD_COLUMNS} FROM images {where} ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
        return [_row_to_record(row) for row in rows], total

    def _inside_outputs(self, path: Path, name: str) -> Path:
        # The name pattern already rules out separators and dots; this holds even if that check were wrong.
        resolved = path.resolve()
        if not resolved.is_relative_to(self.outputs_dir):
            raise ImageNotFoundError(name)
        return resolved

    def full_path(self, name: str) -> Path:
        record = self.get_record(name)
        path = self._inside_outputs(self.outputs_dir / record.image_name, name)
        if not path.is_file():
            raise ImageNotFoundError(name)
        return path

    def thumbnail_path(self, name: str) -> Path:
        """A WEBP at most THUMBNAIL_SIZE px on its long side, made on first request."""
        full = self.full_path(name)
        thumb = self._inside_outputs(self._thumbnails_dir / f"{Path(name).stem}.webp", name)
        if not thumb.is_file():
            with Image.open(full) as image:
                image.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE))
                small = image if image.mode in ("RGB", "RGBA") else image.convert("RGBA")
                _atomic_write(thumb, lambda handle: small.save(handle, format="WEBP", quality=80))
        return thumb

    def get_pil(self, name: str) -> Image.Image:
        with Image.open(self.full_path(name)) as image:
            image.load()
            return image.copy()

    # -- deleting -------------------------------------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Remove the record, the image and its thumbnail."""
        record = self.get_record(name)
        with self._db.transaction() as cursor:
            cursor.execute("DELETE FROM images WHERE image_name = ?", (record.image_name,))
        (self.outputs_dir / record.image_name).unlink(missing_ok=True)
        (self._thumbnails_dir / f"{Path(record.image_name).stem}.webp").unlink(missing_ok=True)

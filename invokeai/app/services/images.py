"""Images: PNG files under outputs_dir, each with a record in the database; the only way in and out for image data."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Literal

from PIL import Image, ImageOps, PngImagePlugin, UnidentifiedImageError
from pydantic import BaseModel, Field, StrictBool, computed_field

from invokeai.app.services.database import Cursor, Database, Row
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
# InvokeAI's name for the same: made by the server (internal) or brought by a client (external).
ResourceOrigin = Literal["internal", "external"]
RESOURCE_ORIGINS: dict[Origin, ResourceOrigin] = {"generated": "internal", "uploaded": "external"}
ORIGINS: dict[ResourceOrigin, Origin] = {internal: ours for ours, internal in RESOURCE_ORIGINS.items()}
# InvokeAI's image categories: what the image is for (user uploads, masks, control images...).
ImageCategory = Literal["general", "mask", "control", "user", "other"]
# What InvokeAI's boards count as images, and as assets.
IMAGE_CATEGORIES: tuple[ImageCategory, ...] = ("general",)
ASSET_CATEGORIES: tuple[ImageCategory, ...] = ("control", "mask", "user", "other")
Direction = Literal["ASC", "DESC"]
# The board_id filter's value for images on no board, as InvokeAI spells it.
UNCATEGORIZED = "none"
# A name list (InvokeAI answers every name at once, for its gallery's virtual scrolling) stops here: bounded work
# and answer size per request. The counts still count every image.
MAX_IMAGE_NAMES = 100_000
# How many names one request may act on (InvokeAI's MAX_IMAGE_BATCH_SIZE).
MAX_IMAGE_BATCH = 1000
# Where InvokeAI's clients fetch an image and its thumbnail (relative, as InvokeAI writes them).
IMAGE_URL = "api/v1/images/i/{name}/full"
THUMBNAIL_URL = "api/v1/images/i/{name}/thumbnail"


class ImageRecord(BaseModel):
    image_name: str = Field(description="The server-generated name of the image")
    width: int = Field(description="Width in pixels")
    height: int = Field(description="Height in pixels")
    created_at: str = Field(description="When the image was stored (ISO 8601, UTC)")
    updated_at: str = Field(description="When the record last changed (ISO 8601, UTC)")
    deleted_at: str | None = Field(default=None, description="Always null: a deleted image is gone (as InvokeAI's)")
    origin: Origin = Field(description="Made by a node, or uploaded by a client")
    session_id: str | None = Field(default=None, description="The session whose graph made the image")
    node_id: str | None = Field(default=None, description="The node that made the image")
    image_category: ImageCategory = Field(default="general", description="What the image is for, as InvokeAI's")
    is_intermediate: bool = Field(
        default=False, description="A step of a graph rather than its result: kept out of the gallery's lists"
    )
    starred: bool = Field(default=False, description="Starred images come first in the gallery's lists")
    has_workflow: bool = Field(default=False, description="Whether a workflow was stored with the image")
    of_incomplete_run: bool = Field(
        default=False,
        description="Made by a queue item's run that did not complete (the item failed, was canceled, or was "
        "interrupted and put back to run again): left out of the image lists unless include_incomplete_runs, and "
        "removed by the queue's prune",
    )

    @computed_field(description="`origin` in InvokeAI's words: internal (generated) or external (uploaded)")
    def image_origin(self) -> ResourceOrigin:
        return RESOURCE_ORIGINS[self.origin]


class ImageUrls(BaseModel):
    image_name: str = Field(description="The image's name")
    image_url: str = Field(description="Where the PNG is (relative to the server, as InvokeAI's)")
    thumbnail_url: str = Field(description="Where its WEBP thumbnail is")


class ImageDTO(ImageRecord):
    """An image as InvokeAI's clients read it: the record, its URLs and its board."""

    image_url: str = Field(description="Where the PNG is (relative to the server, as InvokeAI's)")
    thumbnail_url: str = Field(description="Where its WEBP thumbnail is")
    board_id: str | None = Field(default=None, description="The board the image is on; null: uncategorized")


class ImageNamesResult(BaseModel):
    image_names: list[str] = Field(description=f"The names, in the list's order (at most {MAX_IMAGE_NAMES})")
    starred_count: int = Field(description="How many of them are starred (0 unless starred_first)")
    total_count: int = Field(description="How many images the filters select")


class ImageRecordChanges(BaseModel):
    """What a client may change of an image (InvokeAI's; other fields are ignored, as InvokeAI ignores them)."""

    image_category: ImageCategory | None = Field(default=None, description="The image's new category")
    session_id: str | None = Field(default=None, max_length=255, description="The image's new session id")
    is_intermediate: StrictBool | None = Field(default=None, description="The image's new is_intermediate flag")
    starred: StrictBool | None = Field(default=None, description="Whether the image is starred")


@dataclass(frozen=True)
class ImageFilters:
    """What InvokeAI's image lists select by. board_id: a board's id, or UNCATEGORIZED for images on none."""

    image_origin: ResourceOrigin | None = None
    categories: tuple[ImageCategory, ...] | None = None
    is_intermediate: bool | None = None
    board_id: str | None = None
    search_term: str | None = None
    # The images of runs that did not complete are left out unless asked for: a client's gallery shows the
    # images of runs that completed (and of runs still going), as InvokeAI's lists would.
    include_incomplete_runs: bool = False


# Here rather than in boards.py (which reads images): an image saved onto a board checks that it exists.
class BoardNotFoundError(KeyError):
    def __init__(self, board_id: object) -> None:
        super().__init__(board_id)
        self.board_id = board_id

    def __str__(self) -> str:
        return f"board {self.board_id!r} not found"


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
        updated_at=row["updated_at"] or row["created_at"],
        origin=row["origin"],
        session_id=row["session_id"],
        node_id=row["node_id"],
        image_category=row["image_category"],
        is_intermediate=bool(row["is_intermediate"]),
        starred=bool(row["starred"]),
        has_workflow=bool(row["has_workflow"]),
        of_incomplete_run=bool(row["of_incomplete_run"]),
    )


def image_urls(name: str) -> ImageUrls:
    return ImageUrls(
        image_name=name, image_url=IMAGE_URL.format(name=name), thumbnail_url=THUMBNAIL_URL.format(name=name)
    )


def _row_to_dto(row: Row) -> ImageDTO:
    urls = image_urls(row["image_name"])
    return ImageDTO(
        **_row_to_record(row).model_dump(exclude={"image_origin"}),
        image_url=urls.image_url,
        thumbnail_url=urls.thumbnail_url,
        board_id=row["board_id"],
    )


_STORED_COLUMNS = (
    "image_name, width, height, created_at, updated_at, origin, session_id, node_id, image_category, "
    "is_intermediate, starred, of_incomplete_run"
)
_RECORD_COLUMNS = f"{_STORED_COLUMNS}, workflow IS NOT NULL AS has_workflow"
# The same from images joined with board_images (whose image_name and created_at would be ambiguous).
_DTO_COLUMNS = (
    ", ".join(f"images.{column.strip()}" for column in _STORED_COLUMNS.split(","))
    + ", images.workflow IS NOT NULL AS has_workflow, board_images.board_id AS board_id"
)
_DTO_FROM = "images LEFT JOIN board_images ON board_images.image_name = images.image_name"


def like_pattern(term: str) -> str:
    """`term` as a LIKE pattern matching it anywhere, its own % and _ taken literally (with ESCAPE '\\')."""
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _where(filters: ImageFilters) -> tuple[str, list[Any]]:
    """The SQL conditions (each starting with AND) and parameters that select what `filters` ask for; for a query
    over _DTO_FROM."""
    sql: list[str] = []
    params: list[Any] = []
    if filters.image_origin is not None:
        sql.append("AND images.origin = ?")
        params.append(ORIGINS[filters.image_origin])
    if filters.categories is not None:
        categories = sorted(set(filters.categories))
        if not categories:
            # An empty list selects nothing (IN () is not SQL).
            sql.append("AND 1 = 0")
        else:
            sql.append(f"AND images.image_category IN ({', '.join('?' for _ in categories)})")
            params.extend(categories)
    if filters.is_intermediate is not None:
        sql.append("AND images.is_intermediate = ?")
        params.append(filters.is_intermediate)
    if filters.board_id == UNCATEGORIZED:
        sql.append("AND board_images.board_id IS NULL")
    elif filters.board_id is not None:
        sql.append("AND board_images.board_id = ?")
        params.append(filters.board_id)
    if not filters.include_incomplete_runs:
        sql.append("AND images.of_incomplete_run = FALSE")
    if filters.search_term:
        # InvokeAI searches the metadata and the creation time, whatever the case (PostgreSQL's LIKE minds it).
        pattern = like_pattern(filters.search_term.lower())
        sql.append("AND (LOWER(images.metadata) LIKE ? ESCAPE '\\' OR images.created_at LIKE ? ESCAPE '\\')")
        params.extend([pattern, pattern])
    return " ".join(sql), params


def _order(starred_first: bool, direction: Direction) -> str:
    if direction not in ("ASC", "DESC"):
        raise ValueError(f"direction must be ASC or DESC, not {direction!r}")
    # rowid: SQLite's insertion order; on PostgreSQL a column of that name (see migration 1). It breaks ties
    # between images stored within one clock tick.
    starred = "images.starred DESC, " if starred_first else ""
    return f"ORDER BY {starred}images.created_at {direction}, images.rowid {direction}"


def valid_name(name: object) -> bool:
    return isinstance(name, str) and IMAGE_NAME_PATTERN.match(name) is not None


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
        board_id: str | None = None,
        fence: Callable[[Cursor], None] | None = None,
        queue_item_id: int | None = None,
    ) -> ImageRecord:
        """Store `image` as a new PNG and record it (on board `board_id`, which must exist, when given). Each of
        `metadata` (the generation's settings, JSON), `workflow` (a client's workflow, JSON text kept as sent) and
        `graph` goes in the PNG text chunk InvokeAI names for it, and in the record. `fence` (a queue item's run)
        is called first in the record's transaction: when it raises, nothing is recorded and the file is removed.
        `queue_item_id`: the queue item whose run makes the image; should the run not complete, the item's status
        change marks the image (of_incomplete_run)."""
        if origin not in ("generated", "uploaded"):
            raise ValueError(f"origin must be 'generated' or 'uploaded', not {origin!r}")
        metadata_json = json.dumps(metadata, default=str) if metadata is not None else None
        graph_json = json.dumps(graph, default=str) if graph is not None else None
        return self._store(
            image,
            origin=origin,
            session_id=session_id,
            node_id=node_id,
            metadata_json=metadata_json,
            workflow=workflow,
            graph_json=graph_json,
            image_category=image_category,
            is_intermediate=is_intermediate,
            board_id=board_id,
            fence=fence,
            queue_item_id=queue_item_id,
        )

    def _store(
        self,
        image: Image.Image,
        *,
        origin: Origin,
        session_id: str | None,
        node_id: str | None,
        metadata_json: str | None,
        workflow: str | None,
        graph_json: str | None,
        image_category: ImageCategory,
        is_intermediate: bool,
        board_id: str | None,
        fence: Callable[[Cursor], None] | None = None,
        queue_item_id: int | None = None,
    ) -> ImageRecord:
        image = _png_ready(image)
        name = f"{uuid.uuid4().hex}.png"
        pnginfo = PngImagePlugin.PngInfo()
        for key, text in ((METADATA_KEY, metadata_json), (WORKFLOW_KEY, workflow), (GRAPH_KEY, graph_json)):
            if text is not None:
                # iTXt (UTF-8): a prompt may hold any character, and tEXt is Latin-1.
                pnginfo.add_itxt(key, text)
        path = self.outputs_dir / name
        _atomic_write(path, lambda handle: image.save(handle, format="PNG", pnginfo=pnginfo))
        now = now_iso()
        record = ImageRecord(
            image_name=name,
            width=image.width,
            height=image.height,
            created_at=now,
            updated_at=now,
            origin=origin,
            session_id=session_id,
            node_id=node_id,
            image_category=image_category,
            is_intermediate=is_intermediate,
            has_workflow=workflow is not None,
        )
        try:
            with self._db.transaction() as cursor:
                if fence is not None:
                    fence(cursor)
                cursor.execute(
                    f"INSERT INTO images ({_STORED_COLUMNS}, metadata, workflow, graph, queue_item_id) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.image_name,
                        record.width,
                        record.height,
                        record.created_at,
                        record.updated_at,
                        record.origin,
                        record.session_id,
                        record.node_id,
                        record.image_category,
                        record.is_intermediate,
                        record.starred,
                        record.of_incomplete_run,
                        metadata_json,
                        workflow,
                        graph_json,
                        queue_item_id,
                    ),
                )
                if board_id is not None:
                    # In the same transaction: an image is never stored without the board it was meant for.
                    if cursor.execute("SELECT 1 FROM boards WHERE board_id = ?", (board_id,)).fetchone() is None:
                        raise BoardNotFoundError(board_id)
                    cursor.execute(
                        "INSERT INTO board_images (image_name, board_id, created_at) VALUES (?, ?, ?)",
                        (record.image_name, board_id, now),
                    )
        except BaseException:
            # A file without a record could never be served or deleted; don't leave one.
            path.unlink(missing_ok=True)
            raise
        return record

    def upload(
        self,
        data: bytes,
        filename: str | None = None,
        *,
        image_category: ImageCategory = "user",
        is_intermediate: bool = False,
        board_id: str | None = None,
        session_id: str | None = None,
        crop_visible: bool = False,
        resize_to: tuple[int, int] | None = None,
        metadata: str | None = None,
    ) -> ImageRecord:
        """Store a client's image, re-encoded as PNG. Nothing is stored unless it decodes completely.

        As InvokeAI does, the upload keeps the metadata, workflow and graph chunks an InvokeAI PNG carries (each
        only if it parses as what it should be); `metadata` (JSON text of an object), when given, replaces the
        file's. crop_visible: cut away fully transparent borders. resize_to: (width, height) to resize to."""
        if len(data) > self.max_upload_bytes:
            raise ImageTooLargeError(f"the upload is {len(data)} bytes; the limit is {self.max_upload_bytes}")
        image = self._decode(data)
        chunks = _invokeai_chunks(image, metadata)
        if crop_visible:
            box = image.getbbox()
            if box is not None:
                image = image.crop(box)
        if resize_to is not None:
            image = image.resize(resize_to, Image.Resampling.LANCZOS)
        return self._store(
            image,
            origin="uploaded",
            session_id=session_id,
            node_id=None,
            metadata_json=chunks[METADATA_KEY],
            workflow=chunks[WORKFLOW_KEY],
            graph_json=chunks[GRAPH_KEY],
            image_category=image_category,
            is_intermediate=is_intermediate,
            board_id=board_id,
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
        if not valid_name(name):
            raise ImageNotFoundError(name)
        rows = self._db.execute(f"SELECT {_RECORD_COLUMNS} FROM images WHERE image_name = ?", (name,))
        if not rows:
            raise ImageNotFoundError(name)
        return _row_to_record(rows[0])

    def get_dto(self, name: str) -> ImageDTO:
        if not valid_name(name):
            raise ImageNotFoundError(name)
        rows = self._db.execute(f"SELECT {_DTO_COLUMNS} FROM {_DTO_FROM} WHERE images.image_name = ?", (name,))
        if not rows:
            raise ImageNotFoundError(name)
        return _row_to_dto(rows[0])

    def get_dtos(self, names: Sequence[str]) -> list[ImageDTO]:
        """The DTOs of those of `names` that are images, in the order asked (at most MAX_IMAGE_BATCH names)."""
        if len(names) > MAX_IMAGE_BATCH:
            raise ValueError(f"at most {MAX_IMAGE_BATCH} names at once, not {len(names)}")
        wanted = list(dict.fromkeys(name for name in names if valid_name(name)))
        if not wanted:
            return []
        rows = self._db.execute(
            f"SELECT {_DTO_COLUMNS} FROM {_DTO_FROM} WHERE images.image_name IN ({', '.join('?' for _ in wanted)})",
            wanted,
        )
        found = {row["image_name"]: _row_to_dto(row) for row in rows}
        return [found[name] for name in wanted if name in found]

    def get_metadata(self, name: str) -> dict[str, Any] | None:
        """The metadata stored with the image (the same JSON as in the PNG), or None."""
        raw = self._text_column(name, "metadata")
        return json.loads(raw) if raw is not None else None

    def get_workflow_and_graph(self, name: str) -> tuple[str | None, str | None]:
        """The workflow and the graph stored with the image, as the JSON text in its PNG (or None)."""
        self.get_record(name)
        rows = self._db.execute("SELECT workflow, graph FROM images WHERE image_name = ?", (name,))
        if not rows:
            raise ImageNotFoundError(name)
        return rows[0]["workflow"], rows[0]["graph"]

    def _text_column(self, name: str, column: Literal["metadata"]) -> str | None:
        self.get_record(name)
        rows = self._db.execute(f"SELECT {column} FROM images WHERE image_name = ?", (name,))
        if not rows:
            raise ImageNotFoundError(name)
        value: str | None = rows[0][column]
        return value

    def list(
        self,
        offset: int = 0,
        limit: int = 50,
        *,
        is_intermediate: bool | None = None,
        filters: ImageFilters | None = None,
        starred_first: bool = False,
        direction: Direction = "DESC",
    ) -> tuple[list[ImageDTO], int]:
        """One page of images in the order asked (newest first by default), and how many the filters select."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        if filters is None:
            filters = ImageFilters(is_intermediate=is_intermediate)
        where, params = _where(filters)
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM {_DTO_FROM} WHERE 1 = 1 {where}", params)[0]["n"])
            rows = self._db.execute(
                f"SELECT {_DTO_COLUMNS} FROM {_DTO_FROM} WHERE 1 = 1 {where} {_order(starred_first, direction)} "
                "LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
        return [_row_to_dto(row) for row in rows], total

    def names(
        self, filters: ImageFilters, *, starred_first: bool = True, direction: Direction = "DESC"
    ) -> ImageNamesResult:
        """The names the filters select, in the list's order (the first MAX_IMAGE_NAMES), as InvokeAI's gallery
        reads them; starred_count only when starred_first (as InvokeAI)."""
        where, params = _where(filters)
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM {_DTO_FROM} WHERE 1 = 1 {where}", params)[0]["n"])
            starred = 0
            if starred_first:
                starred = int(
                    self._db.execute(
                        f"SELECT COUNT(*) AS n FROM {_DTO_FROM} WHERE images.starred = TRUE {where}", params
                    )[0]["n"]
                )
            rows = self._db.execute(
                f"SELECT images.image_name FROM {_DTO_FROM} WHERE 1 = 1 {where} {_order(starred_first, direction)} "
                "LIMIT ?",
                (*params, MAX_IMAGE_NAMES),
            )
        return ImageNamesResult(image_names=[row[0] for row in rows], starred_count=starred, total_count=total)

    def intermediates_count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) AS n FROM images WHERE is_intermediate = TRUE")[0]["n"])

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

    # -- changing -------------------------------------------------------------------------------------------

    def update(self, name: str, changes: ImageRecordChanges) -> ImageDTO:
        """Apply the fields of `changes` that are set; the answer is the image as it now is."""
        self.get_record(name)
        values = changes.model_dump(
            exclude_none=True, include={"image_category", "session_id", "is_intermediate", "starred"}
        )
        if values:
            columns = ", ".join(f"{column} = ?" for column in values)
            self._db.execute(
                f"UPDATE images SET {columns}, updated_at = ? WHERE image_name = ?",
                (*values.values(), now_iso(), name),
            )
        return self.get_dto(name)

    def set_starred(self, names: Sequence[str], starred: bool) -> tuple[list[str], list[str]]:
        """Star (or unstar) those of `names` that are images: (their names in the order given, without repeats;
        the boards they are on, UNCATEGORIZED for none)."""
        if len(names) > MAX_IMAGE_BATCH:
            raise ValueError(f"at most {MAX_IMAGE_BATCH} names at once, not {len(names)}")
        wanted = list(dict.fromkeys(name for name in names if valid_name(name)))
        if not wanted:
            return [], []
        marks = ", ".join("?" for _ in wanted)
        with self._db.transaction() as cursor:
            cursor.execute(
                f"UPDATE images SET starred = ?, updated_at = ? WHERE image_name IN ({marks})",
                (starred, now_iso(), *wanted),
            )
            rows = cursor.execute(
                f"SELECT images.image_name, board_images.board_id FROM {_DTO_FROM} "
                f"WHERE images.image_name IN ({marks})",
                wanted,
            ).fetchall()
        boards = {row[0]: row[1] or UNCATEGORIZED for row in rows}
        return [name for name in wanted if name in boards], list(dict.fromkeys(boards.values()))

    # -- deleting -------------------------------------------------------------------------------------------

    def delete(self, name: str) -> str:
        """Remove the record (and its board membership), the image and its thumbnail; the answer is the board it
        was on (UNCATEGORIZED for none)."""
        deleted = self.delete_many([name])
        if not deleted:
            raise ImageNotFoundError(name)
        return deleted[name]

    def delete_many(self, names: Sequence[str]) -> dict[str, str]:
        """Delete those of `names` that are images: {name: the board it was on (UNCATEGORIZED for none)}, in the
        order given."""
        wanted = list(dict.fromkeys(name for name in names if valid_name(name)))
        if not wanted:
            return {}
        marks = ", ".join("?" for _ in wanted)
        with self._db.transaction() as cursor:
            rows = cursor.execute(
                f"SELECT images.image_name, board_images.board_id FROM {_DTO_FROM} "
                f"WHERE images.image_name IN ({marks})",
                wanted,
            ).fetchall()
            boards = {row[0]: row[1] or UNCATEGORIZED for row in rows}
            # board_images rows go with them (ON DELETE CASCADE).
            cursor.execute(f"DELETE FROM images WHERE image_name IN ({marks})", wanted)
        for name in boards:
            self._unlink(name)
        return {name: boards[name] for name in wanted if name in boards}

    def delete_intermediates(self) -> int:
        """Delete every intermediate image; the answer is how many."""
        deleted = 0
        while True:
            # In batches: bounded statements and memory, however many there are.
            rows = self._db.execute(
                "SELECT image_name FROM images WHERE is_intermediate = TRUE LIMIT ?", (MAX_IMAGE_BATCH,)
            )
            if not rows:
                return deleted
            deleted += len(self.delete_many([row[0] for row in rows]))

    def _unlink(self, name: str) -> None:
        (self.outputs_dir / name).unlink(missing_ok=True)
        (self._thumbnails_dir / f"{Path(name).stem}.webp").unlink(missing_ok=True)


def _invokeai_chunks(image: Image.Image, metadata: str | None) -> dict[str, str | None]:
    """The invokeai_metadata, invokeai_workflow and invokeai_graph texts of an uploaded image that parse as what
    they are (a JSON object; a workflow object; a graph with `nodes` and `edges`), as InvokeAI keeps them;
    `metadata`, when given, instead of the file's."""
    info = getattr(image, "text", None) or image.info
    texts = {key: info.get(key) for key in (METADATA_KEY, WORKFLOW_KEY, GRAPH_KEY)}
    if metadata is not None:
        texts[METADATA_KEY] = metadata
    kept: dict[str, str | None] = {}
    for key, text in texts.items():
        parsed = _json_object(text)
        ok = parsed is not None
        if key == GRAPH_KEY and parsed is not None:
            ok = isinstance(parsed.get("nodes"), dict) and isinstance(parsed.get("edges"), list)
        if key == WORKFLOW_KEY and parsed is not None:
            ok = isinstance(parsed.get("nodes"), list) and isinstance(parsed.get("edges"), list)
        kept[key] = text if ok else None
    return kept


def _json_object(text: object) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        parsed = json.loads(text, parse_constant=_refuse_number, parse_float=_finite_float)
        # A lone surrogate (an escaped "\\ud800") could not be answered later as JSON.
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _refuse_number(literal: str) -> Any:
    raise ValueError(f"{literal} is not a finite number")


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise ValueError(f"{literal} is not a finite number")
    return number

"""ImageService with real files and a real SQLite database: storing, metadata, listing, names, thumbnails,
uploads refused whole, deleting."""

from __future__ import annotations

import json
import random
import sqlite3
import struct
import zlib
from io import BytesIO
from pathlib import Path

import pytest
from engine_support import ENGINES
from PIL import Image, PngImagePlugin

from invokeai.app.services.images import (
    METADATA_KEY,
    UNCATEGORIZED,
    ImageFilters,
    ImageNotFoundError,
    ImageRecordChanges,
    ImageService,
    ImageTooLargeError,
    UnsupportedImageError,
)
from invokeai.app.services.sqlite import SqliteDatabase

MAX_UPLOAD = 200_000


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    return tmp_path / "outputs"


@pytest.fixture
def images(db: SqliteDatabase, outputs: Path) -> ImageService:
    return ImageService(db, outputs, max_upload_bytes=MAX_UPLOAD)


def _stored_files(outputs: Path) -> list[Path]:
    return sorted(path for path in outputs.rglob("*") if path.is_file())


def _noise(width: int, height: int) -> Image.Image:
    """Pixels that do not compress, so that the encoded size follows the pixel count."""
    return Image.frombytes("RGB", (width, height), random.Random(0).randbytes(width * height * 3))


def _encoded(image: Image.Image, format: str = "PNG") -> bytes:
    buffer = BytesIO()
    image.save(buffer, format=format)
    return buffer.getvalue()


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_save_writes_a_png_with_metadata_and_a_record(images: ImageService, outputs: Path) -> None:
    metadata = {"graph": {"id": "g", "nodes": {}}, "node_id": "n1", "node_type": "blank_image", "session_id": "s"}
    record = images.save(Image.new("RGB", (30, 20), "blue"), session_id="s", node_id="n1", metadata=metadata)
    assert record.image_name.endswith(".png") and len(record.image_name) == 36
    assert (record.width, record.height, record.origin) == (30, 20, "generated")
    assert (record.session_id, record.node_id) == ("s", "n1")
    path = images.full_path(record.image_name)
    assert path == (outputs / record.image_name).resolve()
    with Image.open(path) as png:
        assert png.format == "PNG"
        assert png.size == (30, 20)
        assert json.loads(png.text[METADATA_KEY]) == metadata
    assert images.get_record(record.image_name) == record
    assert images.get_metadata(record.image_name) == metadata


@pytest.mark.parametrize(
    ("mode", "stored"),
    [("CMYK", "RGB"), ("LAB", "RGB"), ("PA", "RGBA"), ("F", "RGB"), ("RGBA", "RGBA"), ("L", "L"), ("LA", "LA")],
)
def test_save_stores_modes_png_cannot_hold_as_rgb_or_rgba(images: ImageService, mode: str, stored: str) -> None:
    record = images.save(Image.new(mode, (300, 10)))
    assert images.get_pil(record.image_name).mode == stored
    with Image.open(images.thumbnail_path(record.image_name)) as thumb:
        assert thumb.size == (256, 9)


def test_save_converts_colors_faithfully(images: ImageService) -> None:
    record = images.save(Image.new("CMYK", (4, 4), (0, 255, 0, 0)))
    assert images.get_pil(record.image_name).getpixel((0, 0)) == (255, 0, 255)


def test_names_are_unique(images: ImageService) -> None:
    names = {images.save(Image.new("L", (2, 2))).image_name for _ in range(20)}
    assert len(names) == 20


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_list_is_newest_first_with_pagination_and_total(images: ImageService) -> None:
    names = [images.save(Image.new("RGB", (i + 1, 1))).image_name for i in range(7)]
    page, total = images.list(offset=0, limit=3)
    assert total == 7
    assert [record.image_name for record in page] == names[::-1][:3]
    page, total = images.list(offset=5, limit=3)
    assert [record.image_name for record in page] == names[::-1][5:]
    assert total == 7
    assert images.list(offset=10, limit=3) == ([], 7)
    assert images.list(limit=0) == ([], 7)
    with pytest.raises(ValueError):
        images.list(offset=-1)


@pytest.mark.parametrize(
    "name",
    [
        "../invokeai.yaml",
        "..%2f..%2fetc%2fpasswd",
        "%2e%2e",
        "%2e%2e%2finvokeai.yaml",
        "..\\invokeai.yaml",
        "/etc/passwd",
        "thumbnails",
        "",
        "0" * 32 + ".PNG",
        "0" * 32 + ".png/",
        "0" * 32 + ".png\n",
        "0" * 31 + ".png",
        "../" + "0" * 32 + ".png",
    ],
)
def test_names_that_are_not_generated_names_are_not_found(images: ImageService, outputs: Path, name: str) -> None:
    (outputs.parent / "invokeai.yaml").write_text("secret: 1")
    with pytest.raises(ImageNotFoundError):
        images.get_record(name)
    with pytest.raises(ImageNotFoundError):
        images.full_path(name)
    with pytest.raises(ImageNotFoundError):
        images.thumbnail_path(name)
    with pytest.raises(ImageNotFoundError):
        images.delete(name)


def test_a_well_formed_name_without_a_record_is_not_found(images: ImageService, outputs: Path) -> None:
    # Even a file that exists under outputs_dir is not served unless it has a record.
    name = "ab" * 16 + ".png"
    Image.new("RGB", (2, 2)).save(outputs / name)
    with pytest.raises(ImageNotFoundError):
        images.get_record(name)
    with pytest.raises(ImageNotFoundError):
        images.full_path(name)
    with pytest.raises(ImageNotFoundError):
        images.get_pil(name)


def test_a_record_with_a_name_the_service_never_makes_is_not_served(
    images: ImageService, db: SqliteDatabase, outputs: Path
) -> None:
    # However a row got there, only generated names are looked up, so no path is built from it.
    (outputs.parent / "invokeai.yaml").write_text("secret: 1")
    db.execute(
        "INSERT INTO images (image_name, width, height, origin, created_at) VALUES (?, 1, 1, 'uploaded', 'now')",
        ("../invokeai.yaml",),
    )
    with pytest.raises(ImageNotFoundError):
        images.get_record("../invokeai.yaml")
    with pytest.raises(ImageNotFoundError):
        images.full_path("../invokeai.yaml")


def test_a_file_that_resolves_outside_outputs_is_not_served(
    images: ImageService, outputs: Path, tmp_path: Path
) -> None:
    record = images.save(Image.new("RGB", (2, 2)))
    outside = tmp_path / "outside.png"
    Image.new("RGB", (2, 2)).save(outside)
    path = outputs / record.image_name
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(ImageNotFoundError):
        images.full_path(record.image_name)
    with pytest.raises(ImageNotFoundError):
        images.get_pil(record.image_name)


def test_save_leaves_no_file_when_the_record_cannot_be_written(
    images: ImageService, db: SqliteDatabase, outputs: Path
) -> None:
    db.execute("CREATE TRIGGER refuse BEFORE INSERT ON images BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    with pytest.raises(sqlite3.IntegrityError, match="disk full"):
        images.save(Image.new("RGB", (2, 2)))
    assert _stored_files(outputs) == []


def test_a_record_whose_file_is_gone_is_not_found(images: ImageService) -> None:
    record = images.save(Image.new("RGB", (2, 2)))
    images.full_path(record.image_name).unlink()
    with pytest.raises(ImageNotFoundError):
        images.full_path(record.image_name)


def test_thumbnail_is_at_most_256_px_and_kept_under_outputs(images: ImageService, outputs: Path) -> None:
    record = images.save(Image.new("RGB", (1000, 400), "red"))
    thumb = images.thumbnail_path(record.image_name)
    assert thumb.is_relative_to(outputs.resolve() / "thumbnails")
    with Image.open(thumb) as image:
        assert max(image.size) == 256
        assert image.size == (256, 102)
    assert images.thumbnail_path(record.image_name) == thumb
    small = images.save(Image.new("RGBA", (40, 80), (0, 0, 0, 0)))
    with Image.open(images.thumbnail_path(small.image_name)) as image:
        assert image.size == (40, 80)


def test_upload_of_a_real_image_is_stored_as_png(images: ImageService) -> None:
    data = _encoded(Image.new("RGB", (64, 48), (0, 128, 0)), "JPEG")
    record = images.upload(data, "photo.jpg")
    assert (record.origin, record.width, record.height) == ("uploaded", 64, 48)
    with Image.open(images.full_path(record.image_name)) as png:
        assert png.format == "PNG"
    # As InvokeAI: an upload keeps only the metadata an InvokeAI PNG carries (a JPEG has none).
    assert images.get_metadata(record.image_name) is None
    assert images.list()[1] == 1


def _png_with_bad_crc() -> bytes:
    """A PNG whose pixels decode but whose IDAT checksum is wrong: only verify() notices."""
    data = bytearray(_encoded(_noise(16, 16)))
    at = data.index(b"IDAT")
    length = int.from_bytes(data[at - 4 : at], "big")
    data[at + 4 + length] ^= 0xFF
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an image at all",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 100,
        _encoded(_noise(64, 64))[:5000],
        _encoded(_noise(64, 64), "GIF")[:-300],
        _encoded(_noise(64, 64), "JPEG")[:-300],
        _png_with_bad_crc(),
    ],
    ids=["empty", "text", "png-signature-only", "truncated-png", "truncated-gif", "truncated-jpeg", "bad-crc"],
)
def test_upload_of_a_non_image_is_refused_and_nothing_is_stored(
    images: ImageService, outputs: Path, data: bytes
) -> None:
    with pytest.raises(UnsupportedImageError):
        images.upload(data, "x.png")
    assert _stored_files(outputs) == []
    assert images.list() == ([], 0)


def test_upload_over_the_byte_limit_is_refused_and_nothing_is_stored(images: ImageService, outputs: Path) -> None:
    data = _encoded(_noise(300, 300))
    assert len(data) > MAX_UPLOAD
    with pytest.raises(ImageTooLargeError, match=f"limit is {MAX_UPLOAD}"):
        images.upload(data, "big.png")
    # Over the limit is refused before decoding: even bytes that are no image count as too large.
    with pytest.raises(ImageTooLargeError):
        images.upload(b"x" * (MAX_UPLOAD + 1), "big.bin")
    assert _stored_files(outputs) == []
    assert images.list() == ([], 0)


def _png_header_only(width: int, height: int) -> bytes:
    """A tiny PNG that claims width x height pixels: a decompression bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_upload_of_a_decompression_bomb_is_refused(db: SqliteDatabase, outputs: Path) -> None:
    images = ImageService(db, outputs, max_upload_bytes=MAX_UPLOAD, max_upload_pixels=1000 * 1000)
    with pytest.raises(ImageTooLargeError, match="pixels"):
        images.upload(_png_header_only(2000, 2000), "bomb.png")
    assert _stored_files(outputs) == []
    assert images.list() == ([], 0)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_delete_removes_file_thumbnail_and_record(images: ImageService, outputs: Path) -> None:
    keep = images.save(Image.new("RGB", (300, 300)))
    record = images.save(Image.new("RGB", (300, 300)))
    full, thumb = images.full_path(record.image_name), images.thumbnail_path(record.image_name)
    images.delete(record.image_name)
    assert not full.exists() and not thumb.exists()
    with pytest.raises(ImageNotFoundError):
        images.get_record(record.image_name)
    listed, total = images.list()
    assert ([image.image_name for image in listed], total) == ([keep.image_name], 1)
    assert _stored_files(outputs) == [images.full_path(keep.image_name)]
    with pytest.raises(ImageNotFoundError):
        images.delete(record.image_name)


def test_records_survive_a_restart(tmp_path: Path, outputs: Path) -> None:
    db = SqliteDatabase(tmp_path / "invokeai.db")
    record = ImageService(db, outputs, MAX_UPLOAD).save(Image.new("RGB", (5, 5)))
    db.close()
    db = SqliteDatabase(tmp_path / "invokeai.db")
    assert ImageService(db, outputs, MAX_UPLOAD).get_record(record.image_name) == record
    db.close()


# -- InvokeAI's gallery: filters, order, names, stars, changes, deletes --------------------------------------------


def _board(db: SqliteDatabase, board_id: str) -> str:
    db.execute(
        "INSERT INTO boards (board_id, board_name, archived, created_at, updated_at) VALUES (?, ?, FALSE, 'x', 'x')",
        (board_id, board_id),
    )
    return board_id


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_the_list_filters_as_invokeai_does(images: ImageService, db: SqliteDatabase) -> None:
    board = _board(db, "b1")
    made = images.save(Image.new("L", (2, 2)), metadata={"positive_prompt": "A Red Fox"}).image_name
    step = images.save(Image.new("L", (2, 2)), is_intermediate=True, image_category="other").image_name
    mask = images.save(Image.new("L", (2, 2)), image_category="mask", board_id=board).image_name
    user = images.upload(_encoded(Image.new("RGB", (3, 3))), "u.png", image_category="user").image_name

    def names(**filters: object) -> set[str]:
        listed, total = images.list(0, 100, filters=ImageFilters(**filters))  # type: ignore[arg-type]
        assert total == len(listed)
        return {image.image_name for image in listed}

    assert names() == {made, step, mask, user}
    assert names(image_origin="internal") == {made, step, mask}
    assert names(image_origin="external") == {user}
    assert names(categories=("mask", "user")) == {mask, user}
    assert names(categories=()) == set()
    assert names(is_intermediate=True) == {step}
    assert names(is_intermediate=False) == {made, mask, user}
    assert names(board_id=board) == {mask}
    assert names(board_id=UNCATEGORIZED) == {made, step, user}
    # The metadata is searched whatever the case, and % and _ are only themselves.
    assert names(search_term="red fox") == {made}
    assert names(search_term="RED%FOX") == set()
    assert names(search_term="d_fox") == set()
    [dto] = images.list(0, 10, filters=ImageFilters(board_id=board))[0]
    assert (dto.board_id, dto.image_origin, dto.image_url) == (board, "internal", f"api/v1/images/i/{mask}/full")


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_starred_images_come_first_and_the_direction_is_honoured(images: ImageService) -> None:
    names = [images.save(Image.new("L", (1, 1))).image_name for _ in range(4)]
    assert images.set_starred([names[1], "no-such.png", names[1]], True) == ([names[1]], [UNCATEGORIZED])

    def order(**options: object) -> list[str]:
        return [image.image_name for image in images.list(0, 10, **options)[0]]  # type: ignore[arg-type]

    assert order(starred_first=True) == [names[1], names[3], names[2], names[0]]
    assert order(starred_first=True, direction="ASC") == [names[1], names[0], names[2], names[3]]
    assert order(starred_first=False) == names[::-1]
    result = images.names(ImageFilters(), starred_first=True)
    assert (result.image_names, result.starred_count, result.total_count) == (
        [names[1], names[3], names[2], names[0]],
        1,
        4,
    )
    assert images.names(ImageFilters(), starred_first=False).starred_count == 0
    assert images.set_starred([names[1]], False)[0] == [names[1]]
    assert not images.get_dto(names[1]).starred


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_update_changes_the_fields_given_and_updated_at(images: ImageService) -> None:
    record = images.save(Image.new("L", (1, 1)))
    changed = images.update(record.image_name, ImageRecordChanges(image_category="control", starred=True))
    assert (changed.image_category, changed.starred, changed.is_intermediate) == ("control", True, False)
    assert changed.updated_at > record.updated_at and changed.created_at == record.created_at
    changed = images.update(record.image_name, ImageRecordChanges(session_id="s2", is_intermediate=True))
    assert (changed.session_id, changed.is_intermediate, changed.image_category) == ("s2", True, "control")
    with pytest.raises(ImageNotFoundError):
        images.update("0" * 32 + ".png", ImageRecordChanges(starred=True))


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_deleting_images_removes_their_board_membership(images: ImageService, db: SqliteDatabase) -> None:
    board = _board(db, "b1")
    on_board = images.save(Image.new("L", (1, 1)), board_id=board).image_name
    loose = images.save(Image.new("L", (1, 1))).image_name
    assert images.get_dtos([loose, "bad", on_board, loose]) == [images.get_dto(loose), images.get_dto(on_board)]
    assert images.delete_many([on_board, loose, "0" * 32 + ".png"]) == {on_board: board, loose: UNCATEGORIZED}
    assert db.execute("SELECT COUNT(*) FROM board_images")[0][0] == 0
    assert images.list() == ([], 0)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_intermediates_are_counted_and_cleared(images: ImageService, outputs: Path) -> None:
    keep = images.save(Image.new("L", (1, 1)))
    for _ in range(3):
        images.save(Image.new("L", (1, 1)), is_intermediate=True)
    assert images.intermediates_count() == 3
    assert images.delete_intermediates() == 3
    assert images.intermediates_count() == 0
    assert _stored_files(outputs) == [images.full_path(keep.image_name)]


def _png_with_chunks(**chunks: str) -> bytes:
    info = PngImagePlugin.PngInfo()
    for key, text in chunks.items():
        info.add_itxt(key, text)
    buffer = BytesIO()
    Image.new("RGBA", (20, 10), (0, 0, 0, 0)).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def test_an_upload_keeps_the_invokeai_chunks_that_parse(images: ImageService) -> None:
    graph = json.dumps({"id": "g", "nodes": {}, "edges": []})
    workflow = json.dumps({"name": "w", "nodes": [], "edges": []})
    data = _png_with_chunks(invokeai_metadata='{"seed": 1}', invokeai_workflow=workflow, invokeai_graph=graph)
    record = images.upload(data, "a.png")
    assert images.get_metadata(record.image_name) == {"seed": 1}
    assert images.get_workflow_and_graph(record.image_name) == (workflow, graph)
    assert record.has_workflow
    # The client's metadata wins; chunks that do not parse (or hold NaN) are dropped.
    data = _png_with_chunks(invokeai_metadata="[1]", invokeai_workflow='{"nodes": NaN}', invokeai_graph="{}")
    record = images.upload(data, "a.png", metadata='{"seed": 2}')
    assert images.get_metadata(record.image_name) == {"seed": 2}
    assert images.get_workflow_and_graph(record.image_name) == (None, None)
    assert images.get_metadata(images.upload(data, "a.png").image_name) is None


def test_an_upload_is_cropped_to_what_is_visible_and_resized(images: ImageService) -> None:
    image = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    image.paste((255, 0, 0, 255), (5, 6, 15, 10))
    record = images.upload(_encoded(image), "a.png", crop_visible=True)
    assert (record.width, record.height) == (10, 4)
    record = images.upload(_encoded(image), "a.png", resize_to=(8, 6))
    assert (record.width, record.height) == (8, 6)
    # Nothing visible: nothing to crop to, the image stays whole.
    record = images.upload(_encoded(Image.new("RGBA", (7, 5), (0, 0, 0, 0))), "a.png", crop_visible=True)
    assert (record.width, record.height) == (7, 5)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_a_start_removes_image_files_without_a_record_once_past_the_grace_period(
    db: SqliteDatabase, images: ImageService, outputs: Path
) -> None:
    # A kill between an image's rename into place and its record's commit leaves a PNG that nothing names.
    import os
    import time

    from invokeai.app.services.image_orphans import remove_unrecorded_images

    recorded = images.save(Image.new("RGB", (4, 4))).image_name
    images.thumbnail_path(recorded)
    old_orphan, new_orphan = "a" * 32 + ".png", "b" * 32 + ".png"
    for name in (old_orphan, new_orphan):
        Image.new("RGB", (4, 4)).save(outputs / name)
    (outputs / "thumbnails" / f"{'a' * 32}.webp").write_bytes(b"thumb")
    (outputs / "notes.png").write_bytes(b"not one of ours")
    hour_ago = time.time() - 3600
    for name in (recorded, old_orphan, "notes.png"):
        os.utime(outputs / name, (hour_ago, hour_ago))
    assert remove_unrecorded_images(db, outputs, grace_s=600) == [old_orphan]
    left = sorted(p.name for p in outputs.iterdir() if p.is_file())
    assert left == sorted([recorded, new_orphan, "notes.png"])  # a recent one may be a live server's write
    assert sorted(p.name for p in (outputs / "thumbnails").iterdir()) == [f"{recorded[:-4]}.webp"]
    assert images.get_pil(recorded).size == (4, 4)

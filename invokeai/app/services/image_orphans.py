"""Image files without a record. An image is written (through a temporary, renamed into place) and then recorded;
a kill between the rename and the record's commit leaves a PNG that nothing lists, serves or deletes. A start
removes such files, with their thumbnails, once they are older than a grace period: another live server's image
is recorded milliseconds after its file is in place, so an unrecorded file that old is nobody's write in progress,
whichever host (in a shared outputs_dir) made it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from invokeai.app.services.database import Database
from invokeai.app.services.images import IMAGE_NAME_PATTERN, THUMBNAILS_DIR
from invokeai.app.services.owned_temporaries import STALE_AFTER_S

logger = logging.getLogger(__name__)

# SQLite's limit on bound parameters.
_CHUNK = 500


def remove_unrecorded_images(db: Database, outputs_dir: Path, grace_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the image files of `outputs_dir` (the names the image service makes) that have no record and have not
    changed for `grace_s` seconds, and their thumbnails. Returns their names."""
    now = time.time()
    candidates: list[str] = []
    for path in outputs_dir.glob("*.png"):
        try:
            old = path.is_file() and now - path.stat().st_mtime > grace_s
        except FileNotFoundError:  # deleted meanwhile
            continue
        if old and IMAGE_NAME_PATTERN.match(path.name):
            candidates.append(path.name)
    removed: list[str] = []
    for start in range(0, len(candidates), _CHUNK):
        chunk = candidates[start : start + _CHUNK]
        marks = ", ".join("?" for _ in chunk)
        recorded = {row[0] for row in db.execute(f"SELECT image_name FROM images WHERE image_name IN ({marks})", chunk)}
        for name in chunk:
            if name in recorded:
                continue
            (outputs_dir / name).unlink(missing_ok=True)
            (outputs_dir / THUMBNAILS_DIR / f"{Path(name).stem}.webp").unlink(missing_ok=True)
            removed.append(name)
    if removed:
        logger.info("Removed %d image file(s) that no record names (left by a write that did not finish)", len(removed))
    return removed

"""First-run demo models: on a server with no model installed, build the tiny random-weight demo models under
models_dir and record them, so that the first generation on a fresh machine needs no download."""

from __future__ import annotations

import logging
import time

from invokeai.app.logging_setup import route_ml_library_logging
from invokeai.app.services.model_install import ModelInstallService, remove_path
from invokeai.app.services.model_records import ModelRecord

logger = logging.getLogger(__name__)


def install_demo_models(installer: ModelInstallService) -> list[ModelRecord]:
    """Build and record the demo models if no model is recorded; returns the new records ([] when skipped).

    A demo model's files already on disk without a record (the database was deleted, or it lives in memory) are
    built again: builds are deterministic, so this rewrites the same bytes, and it keeps one way in.
    """
    if installer.records.count():
        return []
    # Imported here: the builder pulls in diffusers and transformers, which a server with models never needs.
    route_ml_library_logging()
    from invokeai.backend.families import FAMILIES
    from invokeai.backend.models.demo import build_demo_models, demo_target

    started = time.monotonic()
    records = []
    for family in FAMILIES:
        # Laid out like installed models: models_dir/<family>/<name>.
        folder = installer.models_dir / family.name
        for demo in family.demos:
            leftover = demo_target(folder, demo.name)
            if leftover.exists():
                remove_path(leftover)
            for model in build_demo_models(folder, (demo.name,)):
                records.append(installer.register_built(model.path, model.name, model.description))
    logger.info(
        "Installed %d demo models (%s) in %.1f s: random weights, for trying the pipelines; their images are noise",
        len(records),
        ", ".join(record.name for record in records),
        time.monotonic() - started,
    )
    return records

"""Numbered schema migrations. Append new ones to MIGRATIONS; never edit or renumber one that has shipped."""

from __future__ import annotations

from invokeai.app.services.migrations.base import Migration, MigrationError, run_migrations
from invokeai.app.services.migrations.m001_images import migration as m001_images
from invokeai.app.services.migrations.m002_session_queue import migration as m002_session_queue
from invokeai.app.services.migrations.m003_models import migration as m003_models
from invokeai.app.services.migrations.m004_queue_graphs import migration as m004_queue_graphs
from invokeai.app.services.migrations.m005_queue_origin import migration as m005_queue_origin
from invokeai.app.services.migrations.m006_queue_claims import migration as m006_queue_claims
from invokeai.app.services.migrations.m007_image_flags import migration as m007_image_flags
from invokeai.app.services.migrations.m008_boards_workflows import migration as m008_boards_workflows
from invokeai.app.services.migrations.m009_model_settings import migration as m009_model_settings
from invokeai.app.services.migrations.m010_queue_claim_token import migration as m010_queue_claim_token
from invokeai.app.services.migrations.m011_image_runs import migration as m011_image_runs

MIGRATIONS: list[Migration] = [
    m001_images,
    m002_session_queue,
    m003_models,
    m004_queue_graphs,
    m005_queue_origin,
    m006_queue_claims,
    m007_image_flags,
    m008_boards_workflows,
    m009_model_settings,
    m010_queue_claim_token,
    m011_image_runs,
]

__all__ = ["MIGRATIONS", "Migration", "MigrationError", "run_migrations"]

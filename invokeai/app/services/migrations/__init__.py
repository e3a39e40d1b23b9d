"""Numbered schema migrations. Append new ones to MIGRATIONS; never edit or renumber one that has shipped."""

from __future__ import annotations

from invokeai.app.services.migrations.base import Migration, MigrationError, run_migrations
from invokeai.app.services.migrations.m001_images import migration as m001_images

MIGRATIONS: list[Migration] = [
    m001_images,
]

__all__ = ["MIGRATIONS", "Migration", "MigrationError", "run_migrations"]

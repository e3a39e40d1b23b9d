"""The workflow library: workflows (InvokeAI's workflow editor documents) that clients save, list, open and
delete. Each is stored as the JSON InvokeAI's clients send, with the columns the library lists and filters by.
This server has one user: every workflow is its, and public (as InvokeAI records single-user workflows)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from invokeai.app.services.database import Database, Row
from invokeai.app.services.images import Direction, like_pattern
from invokeai.app.services.pagination import PaginatedResults
from invokeai.app.services.timestamps import now_iso

SYSTEM_USER = "system"
MAX_WORKFLOW_NAME = 300
# A bound on what one server keeps (the list answers every item when per_page is not given).
MAX_WORKFLOWS = 10_000
MAX_PER_PAGE = 1000
# semver 2.0.0 (InvokeAI checks meta.version with the semver package).
SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)

WorkflowCategory = Literal["user", "default"]
WorkflowOrderBy = Literal["created_at", "updated_at", "opened_at", "name", "is_public"]


class ExposedField(BaseModel):
    nodeId: str
    fieldName: str


class WorkflowMeta(BaseModel):
    version: str = Field(pattern=SEMVER_PATTERN, description="The version of the workflow schema (semver).")
    category: WorkflowCategory = Field(description="user, or default (InvokeAI's own, which cannot be saved here).")


class WorkflowWithoutID(BaseModel):
    """A workflow as InvokeAI's editor writes it; nodes, edges and form are kept as sent (InvokeAI's frontend
    checks them). Fields InvokeAI does not know are dropped, as InvokeAI drops them."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(max_length=MAX_WORKFLOW_NAME, description="The name of the workflow.")
    author: str = Field(description="The author of the workflow.")
    description: str = Field(description="The description of the workflow.")
    version: str = Field(description="The version of the workflow.")
    contact: str = Field(description="The contact of the workflow.")
    tags: str = Field(description="The tags of the workflow, comma-separated.")
    notes: str = Field(description="The notes of the workflow.")
    exposedFields: list[ExposedField] = Field(description="The exposed fields of the workflow.")
    meta: WorkflowMeta = Field(description="The meta of the workflow.")
    nodes: list[dict[str, JsonValue]] = Field(description="The nodes of the workflow.")
    edges: list[dict[str, JsonValue]] = Field(description="The edges of the workflow.")
    form: dict[str, JsonValue] | None = Field(default=None, description="The form of the workflow.")


class Workflow(WorkflowWithoutID):
    id: str = Field(max_length=255, description="The id of the workflow.")


_WORKFLOW = TypeAdapter(Workflow)


class WorkflowRecordBase(BaseModel):
    workflow_id: str = Field(description="The id of the workflow.")
    name: str = Field(description="The name of the workflow.")
    created_at: str = Field(description="When it was saved first (ISO 8601, UTC).")
    updated_at: str = Field(description="When it was saved last (ISO 8601, UTC).")
    opened_at: str | None = Field(default=None, description="When a client last opened it (PUT opened_at).")
    user_id: str = Field(description="Its owner: always 'system' (this server has one user).")
    is_public: bool = Field(description="Always true (one user: every workflow is shared with every user).")


class WorkflowRecordDTO(WorkflowRecordBase):
    workflow: Workflow = Field(description="The workflow.")


class WorkflowRecordWithThumbnailDTO(WorkflowRecordDTO):
    thumbnail_url: str | None = Field(default=None, description="Always null: this server keeps no thumbnails.")


class WorkflowRecordListItemWithThumbnailDTO(WorkflowRecordBase):
    description: str = Field(description="The description of the workflow.")
    category: WorkflowCategory = Field(description="The category of the workflow.")
    tags: str = Field(description="The tags of the workflow.")
    thumbnail_url: str | None = Field(default=None, description="Always null: this server keeps no thumbnails.")


WorkflowPage = PaginatedResults[WorkflowRecordListItemWithThumbnailDTO]


class WorkflowNotFoundError(KeyError):
    def __init__(self, workflow_id: object) -> None:
        super().__init__(workflow_id)
        self.workflow_id = workflow_id

    def __str__(self) -> str:
        return f"workflow {self.workflow_id!r} not found"


class WorkflowLibraryFullError(RuntimeError):
    pass


class DefaultWorkflowError(ValueError):
    """A workflow of the default category: InvokeAI's own, never saved through the API."""


_COLUMNS = "workflow_id, workflow, name, created_at, updated_at, opened_at, user_id, is_public"
_LIST_COLUMNS = "workflow_id, name, description, category, tags, created_at, updated_at, opened_at, user_id, is_public"


def _row_to_dto(row: Row) -> WorkflowRecordWithThumbnailDTO:
    return WorkflowRecordWithThumbnailDTO(
        workflow_id=row["workflow_id"],
        name=row["name"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        opened_at=row["opened_at"],
        user_id=row["user_id"],
        is_public=bool(row["is_public"]),
        workflow=_WORKFLOW.validate_json(row["workflow"]),
    )


def _row_to_item(row: Row) -> WorkflowRecordListItemWithThumbnailDTO:
    return WorkflowRecordListItemWithThumbnailDTO(
        workflow_id=row["workflow_id"],
        name=row["name"],
        description=row["description"],
        category=row["category"],
        tags=row["tags"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        opened_at=row["opened_at"],
        user_id=row["user_id"],
        is_public=bool(row["is_public"]),
    )


def _conditions(
    categories: Sequence[WorkflowCategory] | None,
    has_been_opened: bool | None,
    is_public: bool | None,
    query: str | None = None,
    tags: Sequence[str] | None = None,
) -> tuple[str, list[object]]:
    """A WHERE clause (or "") and its parameters. Text matches ignore case on both engines, as SQLite's LIKE
    does (InvokeAI's)."""
    sql: list[str] = []
    params: list[object] = []
    if categories:
        chosen = sorted(set(categories))
        sql.append(f"category IN ({', '.join('?' for _ in chosen)})")
        params.extend(chosen)
    if has_been_opened is not None:
        sql.append("opened_at IS NOT NULL" if has_been_opened else "opened_at IS NULL")
    if is_public is not None:
        sql.append("is_public = ?")
        params.append(is_public)
    stripped = query.strip() if query else ""
    if stripped:
        pattern = like_pattern(stripped.lower())
        sql.append(
            "(" + " OR ".join(f"LOWER({column}) LIKE ? ESCAPE '\\'" for column in ("name", "description", "tags")) + ")"
        )
        params.extend([pattern] * 3)
    wanted_tags = [tag.strip().lower() for tag in tags or () if tag.strip()]
    if wanted_tags:
        sql.append("(" + " OR ".join("LOWER(tags) LIKE ? ESCAPE '\\'" for _ in wanted_tags) + ")")
        params.extend(like_pattern(tag) for tag in wanted_tags)
    return ("WHERE " + " AND ".join(sql)) if sql else "", params


class WorkflowService:
    def __init__(self, db: Database, max_workflows: int = MAX_WORKFLOWS) -> None:
        self._db = db
        self.max_workflows = max_workflows

    def get(self, workflow_id: str) -> WorkflowRecordWithThumbnailDTO:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM workflow_library WHERE workflow_id = ?", (workflow_id,))
        if not rows:
            raise WorkflowNotFoundError(workflow_id)
        return _row_to_dto(rows[0])

    def create(self, workflow: WorkflowWithoutID) -> WorkflowRecordDTO:
        if workflow.meta.category == "default":
            raise DefaultWorkflowError("default workflows are InvokeAI's own and cannot be saved: use category user")
        saved = Workflow(**workflow.model_dump(), id=str(uuid.uuid4()))
        now = now_iso()
        with self._db.transaction() as cursor:
            count = int(cursor.execute("SELECT COUNT(*) FROM workflow_library").fetchone()[0])
            if count >= self.max_workflows:
                raise WorkflowLibraryFullError(
                    f"the library keeps at most {self.max_workflows} workflows, and has as many: delete one first"
                )
            cursor.execute(
                "INSERT INTO workflow_library (workflow_id, workflow, name, description, tags, category, user_id, "
                "is_public, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    saved.id,
                    saved.model_dump_json(),
                    saved.name,
                    saved.description,
                    saved.tags,
                    saved.meta.category,
                    SYSTEM_USER,
                    True,
                    now,
                    now,
                ),
            )
        return self.get(saved.id)

    def update(self, workflow: Workflow) -> WorkflowRecordDTO:
        if workflow.meta.category == "default":
            raise DefaultWorkflowError("default workflows are InvokeAI's own and cannot be saved: use category user")
        with self._db.transaction() as cursor:
            cursor.execute(
                "UPDATE workflow_library SET workflow = ?, name = ?, description = ?, tags = ?, category = ?, "
                "updated_at = ? WHERE workflow_id = ?",
                (
                    workflow.model_dump_json(),
                    workflow.name,
                    workflow.description,
                    workflow.tags,
                    workflow.meta.category,
                    now_iso(),
                    workflow.id,
                ),
            )
            if cursor.rowcount == 0:
                raise WorkflowNotFoundError(workflow.id)
        return self.get(workflow.id)

    def delete(self, workflow_id: str) -> None:
        with self._db.transaction() as cursor:
            cursor.execute("DELETE FROM workflow_library WHERE workflow_id = ?", (workflow_id,))
            if cursor.rowcount == 0:
                raise WorkflowNotFoundError(workflow_id)

    def mark_opened(self, workflow_id: str) -> None:
        with self._db.transaction() as cursor:
            cursor.execute("UPDATE workflow_library SET opened_at = ? WHERE workflow_id = ?", (now_iso(), workflow_id))
            if cursor.rowcount == 0:
                raise WorkflowNotFoundError(workflow_id)

    def list(
        self,
        *,
        page: int = 0,
        per_page: int | None = None,
        order_by: WorkflowOrderBy = "name",
        direction: Direction = "ASC",
        categories: Sequence[WorkflowCategory] | None = None,
        tags: Sequence[str] | None = None,
        query: str | None = None,
        has_been_opened: bool | None = None,
        is_public: bool | None = None,
    ) -> WorkflowPage:
        """A page of the library's workflows (every one when per_page is None), as InvokeAI lists them."""
        if order_by not in ("created_at", "updated_at", "opened_at", "name", "is_public"):
            raise ValueError(f"cannot order by {order_by!r}")
        if direction not in ("ASC", "DESC"):
            raise ValueError(f"direction must be ASC or DESC, not {direction!r}")
        where, params = _conditions(categories, has_been_opened, is_public, query, tags)
        # Unopened workflows last when ordering by opened_at, on both engines (they differ on where NULLs go).
        nulls = "opened_at IS NULL, " if order_by == "opened_at" else ""
        order = f"ORDER BY {nulls}{order_by} {direction}, workflow_id {direction}"
        limit = per_page if per_page else self.max_workflows
        offset = page * per_page if per_page else 0
        with self._db.read_transaction():
            total = int(self._db.execute(f"SELECT COUNT(*) AS n FROM workflow_library {where}", params)[0]["n"])
            rows = self._db.execute(
                f"SELECT {_LIST_COLUMNS} FROM workflow_library {where} {order} LIMIT ? OFFSET ?",
                (*params, limit, offset),
            )
        return WorkflowPage(
            page=page,
            pages=math.ceil(total / per_page) if per_page else 1,
            per_page=per_page if per_page else total,
            total=total,
            items=[_row_to_item(row) for row in rows],
        )

    def tags(self, categories: Sequence[WorkflowCategory] | None = None, is_public: bool | None = None) -> list[str]:
        """Every tag of the workflows the filters select, sorted, without repeats."""
        where, params = _conditions(categories, None, is_public)
        rows = self._db.execute(f"SELECT DISTINCT tags FROM workflow_library {where}", params)
        found = {tag.strip() for row in rows for tag in (row[0] or "").split(",")}
        return sorted(tag for tag in found if tag)

    def counts_by_tag(
        self,
        tags: Sequence[str],
        categories: Sequence[WorkflowCategory] | None = None,
        has_been_opened: bool | None = None,
        is_public: bool | None = None,
    ) -> dict[str, int]:
        """For each tag, how many of the workflows the filters select have it (anywhere in their tags, as
        InvokeAI matches them)."""
        counts: dict[str, int] = {}
        with self._db.read_transaction():
            for tag in dict.fromkeys(tags):
                where, params = _conditions(categories, has_been_opened, is_public, tags=[tag])
                counts[tag] = int(self._db.execute(f"SELECT COUNT(*) AS n FROM workflow_library {where}", params)[0][0])
        return counts

    def counts_by_category(
        self,
        categories: Sequence[WorkflowCategory],
        has_been_opened: bool | None = None,
        is_public: bool | None = None,
    ) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._db.read_transaction():
            for category in dict.fromkeys(categories):
                where, params = _conditions([category], has_been_opened, is_public)
                counts[category] = int(
                    self._db.execute(f"SELECT COUNT(*) AS n FROM workflow_library {where}", params)[0][0]
                )
        return counts

"""The page shapes InvokeAI's lists answer with; FastAPI names their schemas as InvokeAI's are named
(`OffsetPaginatedResults_ImageDTO_`, ...)."""

from __future__ import annotations

from typing import Generic, TypeVar

from pydantic import BaseModel, Field

Item = TypeVar("Item", bound=BaseModel)


class OffsetPaginatedResults(BaseModel, Generic[Item]):
    limit: int = Field(description="How many items were asked for")
    offset: int = Field(description="How many were skipped")
    total: int = Field(description="How many there are in all (of those the filters select)")
    items: list[Item] = Field(description="The page's items")


class PaginatedResults(BaseModel, Generic[Item]):
    page: int = Field(description="The page (from 0)")
    pages: int = Field(description="How many pages there are")
    per_page: int = Field(description="Items per page (all of them when no page size was given)")
    total: int = Field(description="How many there are in all (of those the filters select)")
    items: list[Item] = Field(description="The page's items")

"""GET /api/v2/models/ records in InvokeAI 6.14.2's fields for every registered family's demo models, InvokeAI's list
filters (base_models, model_type, model_name, model_format) and get_by_attrs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from model_test_support import MODELS, installed

from invokeai.app.invokeai_taxonomy import BASES, INVOKEAI_MODEL_FORMATS, INVOKEAI_MODEL_TYPES
from invokeai.backend.families import DemoModel, Family
from invokeai.backend.families.registry import FAMILIES

DEMOS: list[tuple[Family, DemoModel]] = [(family, demo) for family in FAMILIES for demo in family.demos]
# The fields every one of InvokeAI 6.14.2's model config schemas requires (AnyModelConfig's common part), and those
# its main-model configs add.
INVOKEAI_REQUIRED = {
    "key",
    "hash",
    "path",
    "file_size",
    "name",
    "description",
    "source",
    "source_type",
    "source_api_response",
    "source_url",
    "cover_image",
    "type",
    "format",
    "base",
}
INVOKEAI_MAIN_REQUIRED = {"trigger_phrases", "default_settings", "variant"}


@pytest.fixture
def records(client: TestClient, built_models: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Every registered family's demo models, installed in place: their records by name."""
    return {demo.name: installed(client, built_models[demo.name], inplace=True) for _, demo in DEMOS}


def names(client: TestClient, **query: Any) -> list[str]:
    response = client.get(f"{MODELS}/", params=query)
    assert response.status_code == 200, response.text
    return [m["name"] for m in response.json()["models"]]


@pytest.mark.parametrize(("family", "demo"), DEMOS, ids=[demo.name for _, demo in DEMOS])
def test_a_demo_record_has_invokeais_fields_and_its_familys_base(
    client: TestClient, built_models: dict[str, Path], family: Family, demo: DemoModel
) -> None:
    record = installed(client, built_models[demo.name], inplace=True)
    assert INVOKEAI_REQUIRED <= set(record)
    assert record["base"] == family.invokeai.base
    # Every family so far has a base of InvokeAI's own; a family InvokeAI lacks would name one of this server's.
    assert record["base"] in BASES
    assert record["type"] in INVOKEAI_MODEL_TYPES and record["format"] in INVOKEAI_MODEL_FORMATS
    assert isinstance(record["file_size"], int) and record["file_size"] == record["size"] > 0
    assert record["file_size"] == sum(
        f.stat().st_size for f in [Path(record["path"]), *Path(record["path"]).rglob("*")] if f.is_file()
    )
    assert (record["family"], record["source_type"], record["hash"][:7]) == (family.name, "path", "sha256:")
    # A pipeline is InvokeAI's main model; a lone transformer too (its loader takes the other parts separately).
    assert record["pipeline"] == (demo.type == "main")
    if demo.type in ("main", "transformer"):
        assert record["type"] == "main"
        assert INVOKEAI_MAIN_REQUIRED <= set(record)
    assert record["format"] == {"gguf": "gguf_quantized"}.get(demo.format, demo.format)
    assert record["repo_variant"] == ("" if demo.format == "diffusers" else None)
    # The variant, prediction type and default settings are the family's own reading of the model's configs.
    from invokeai.backend.models.describe import describe_model
    from invokeai.backend.models.probe import probe_model

    facts = describe_model(probe_model(Path(record["path"])))
    assert (record["variant"], record["prediction_type"]) == (facts.variant, facts.prediction_type)
    settings = {k: v for k, v in (record["default_settings"] or {}).items() if v is not None}
    assert settings == dict(facts.default_settings or {})
    assert client.get(f"{MODELS}/i/{record['key']}").json() == record


def test_base_models_filters_by_any_of_the_bases(client: TestClient, records: dict[str, dict[str, Any]]) -> None:
    assert names(client) == sorted(records)
    bases = sorted({family.invokeai.base for family in FAMILIES})
    for base in bases:
        expected = sorted(demo.name for family, demo in DEMOS if family.invokeai.base == base)
        assert names(client, base_models=base) == expected
        assert all(records[name]["base"] == base for name in expected)
    two = bases[:2]
    assert names(client, base_models=two) == sorted(n for n, r in records.items() if r["base"] in two)
    # A base InvokeAI has but no model here: nothing, not an error.
    absent = next(base for base in BASES if base not in bases)
    assert names(client, base_models=absent) == []


def test_model_type_name_and_format_filter(client: TestClient, records: dict[str, dict[str, Any]]) -> None:
    for model_type in {r["type"] for r in records.values()} | {"vae"}:
        assert names(client, model_type=model_type) == sorted(n for n, r in records.items() if r["type"] == model_type)
    for model_format in {r["format"] for r in records.values()}:
        expected = sorted(n for n, r in records.items() if r["format"] == model_format)
        assert names(client, model_format=model_format) == expected
    first = sorted(records)[0]
    assert names(client, model_name=first) == [first]
    assert names(client, model_name=first.upper()) == []  # InvokeAI's model_name is an exact match
    # The filters all apply together, and this server's own family filter with them.
    family, demo = DEMOS[0]
    assert names(
        client, base_models=family.invokeai.base, model_name=demo.name, model_format=records[demo.name]["format"]
    ) == [demo.name]
    assert names(client, family=family.name) == sorted(d.name for f, d in DEMOS if f is family)
    assert names(client, family=family.name, model_format="checkpoint", model_type="main") == sorted(
        d.name for f, d in DEMOS if f is family and records[d.name]["format"] == "checkpoint"
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"base_models": "sd-9"}, "base_models"),
        ({"model_type": "transformer"}, "model_type"),
        ({"model_format": "gguf"}, "model_format"),
        ({"family": "sd-3"}, "family"),
        ({"model_name": "x" * 201}, "model_name"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_field(client: TestClient, query: dict[str, str], field: str) -> None:
    response = client.get(f"{MODELS}/", params=query)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][:2] == ["query", field]


def test_too_many_base_models_are_refused(client: TestClient) -> None:
    response = client.get(f"{MODELS}/", params={"base_models": ["sd-1"] * 65})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][:2] == ["query", "base_models"]


def test_get_by_attrs_finds_by_name_type_and_base(client: TestClient, records: dict[str, dict[str, Any]]) -> None:
    for name, record in records.items():
        query = {"name": name, "type": record["type"], "base": record["base"]}
        response = client.get(f"{MODELS}/get_by_attrs", params=query)
        assert response.status_code == 200 and response.json() == record
    name, record = next(iter(records.items()))
    other_base = next(b for b in BASES if b != record["base"])
    for query in (
        {"name": name, "type": "vae", "base": record["base"]},
        {"name": name, "type": record["type"], "base": other_base},
        {"name": "nothing", "type": record["type"], "base": record["base"]},
    ):
        missing = client.get(f"{MODELS}/get_by_attrs", params=query)
        assert missing.status_code == 404 and "no model named" in missing.json()["detail"]
    assert client.get(f"{MODELS}/get_by_attrs", params={"name": name, "type": "main"}).status_code == 422
    assert client.get(f"{MODELS}/get_by_attrs", params={"name": name, "type": "x", "base": "sd-1"}).status_code == 422


def test_missing_lists_the_models_whose_files_are_gone(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    _, demo = DEMOS[0]
    copy = tmp_path / f"{demo.name}-moved-away"
    shutil.copytree(built_models[demo.name], copy)
    record = installed(client, copy, inplace=True)
    assert client.get(f"{MODELS}/missing").json() == {"models": []}
    shutil.rmtree(copy)
    missing = client.get(f"{MODELS}/missing").json()["models"]
    assert [m["key"] for m in missing] == [record["key"]]

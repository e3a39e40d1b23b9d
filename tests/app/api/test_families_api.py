"""GET /api/v1/app/families: one entry per registered family, in the registry's order, every value read from the
family's descriptor and its nodes' schemas, and each node type one the server's graphs accept."""

from __future__ import annotations

from fastapi.testclient import TestClient

from invokeai.app.nodes.base import invocation_class
from invokeai.backend.families import FAMILIES


def test_families_lists_every_registered_family_in_order(client: TestClient) -> None:
    answer = client.get("/api/v1/app/families")
    assert answer.status_code == 200
    assert [entry["name"] for entry in answer.json()] == [family.name for family in FAMILIES]


def test_each_entry_is_what_the_descriptor_and_the_node_schemas_say(client: TestClient) -> None:
    by_name = {entry["name"]: entry for entry in client.get("/api/v1/app/families").json()}
    for family in FAMILIES:
        entry, graph = by_name[family.name], family.graph
        assert entry["label"] == family.title
        assert entry["size_multiple"] == family.constants.size_multiple
        assert entry["demos"] == [demo.name for demo in family.demos]
        nodes = {role: node_type for role, node_type in entry["nodes"].items() if node_type}
        assert set(nodes.values()) == set(graph.node_types())
        for node_type in nodes.values():
            assert invocation_class(node_type) is not None, node_type
        denoise = invocation_class(graph.denoise).model_fields
        # The guidance input is one the denoise node has, and the defaults are that node's own.
        assert entry["guidance"]["field"] in denoise
        assert entry["defaults"] == {
            "width": denoise["width"].default,
            "height": denoise["height"].default,
            "steps": denoise[graph.steps_field].default,
            "guidance": denoise[graph.guidance_field].default,
        }
        assert entry["conditioning_field"] in denoise
        assert entry["steps_field"] == graph.steps_field and graph.steps_field in denoise
        assert entry["image_to_image"] == (graph.encode is not None and "latents" in denoise)
        if entry["image_to_image"]:
            assert entry["strength_field"] in denoise
        # A loader's links name outputs the loader has and inputs the fed nodes have.
        if graph.loader:
            outputs = invocation_class(graph.loader).output_class().output_fields()
            for role, links in entry["loader_links"].items():
                fed = invocation_class(entry["nodes"][role]).model_fields
                for link in links:
                    assert link["output"] in outputs and link["input"] in fed, (role, link)
        else:
            assert entry["loader_links"] == {}
            for node_type in nodes.values():
                assert "model" in invocation_class(node_type).model_fields, node_type


def test_the_route_is_typed_in_the_openapi_document(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    schema = document["paths"]["/api/v1/app/families"]["get"]["responses"]["200"]["content"]["application/json"]
    assert schema["schema"]["items"]["$ref"].endswith("/FamilyInfo")

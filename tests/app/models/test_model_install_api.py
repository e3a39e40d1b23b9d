"""POST /api/v2/models/install and the record routes: each kind installs (copied or in place), and refusals leave
no record and no files behind."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from model_test_support import MODELS, install, models_dir_files

from invokeai.app.services import model_install
from invokeai.app.services.events import EventBase, ModelInstallCompleteEvent, ModelInstallProgressEvent
from invokeai.backend.families.registry import FAMILIES

KINDS = {
    # source name: (family, type, format, config_variant, installed file or folder name)
    "demo-sd1": ("sd-1", "main", "diffusers", None, "sd-1/demo-sd1"),
    "demo-krea2": ("krea2", "main", "diffusers", None, "krea2/demo-krea2"),
    "demo-krea2-gguf": ("krea2", "transformer", "gguf", "krea2-demo", "krea2/demo-krea2-gguf.gguf"),
    "sd1-single": ("sd-1", "main", "checkpoint", "sd-1-demo", "sd-1/sd1-single.safetensors"),
}


@pytest.mark.parametrize("source", list(KINDS))
def test_each_kind_is_probed_copied_hashed_and_listed(
    client: TestClient, built_models: dict[str, Path], source: str
) -> None:
    family, type_, format_, variant, installed = KINDS[source]
    response = install(client, built_models[source], description="mine")
    assert response.status_code == 201, response.text
    record = response.json()
    assert (record["family"], record["type"], record["format"]) == (family, type_, format_)
    assert (record["name"], record["source"], record["description"]) == (source, str(built_models[source]), "mine")
    assert record["config_variant"] == variant
    assert models_dir_files(client)[:2] == [family, installed]
    path = Path(record["path"])
    assert path == client.app.state.config.models_path / installed  # type: ignore[attr-defined]
    assert record["size"] == sum(f.stat().st_size for f in [path, *path.rglob("*")] if f.is_file())
    assert record["hash"].startswith("sha256:") and len(record["hash"]) == 71
    if path.is_file():
        assert record["hash"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert client.get(f"{MODELS}/i/{record['key']}").json() == record
    assert client.get(f"{MODELS}/").json() == {"models": [record]}


def test_folder_hash_covers_names_and_contents(client: TestClient, built_models: dict[str, Path]) -> None:
    first = install(client, built_models["demo-sd1"], name="one").json()
    again = install(client, built_models["demo-sd1"], name="two").json()
    assert first["hash"] == again["hash"]
    assert first["hash"] != install(client, built_models["demo-krea2"]).json()["hash"]


def test_hashing_can_be_turned_off(make_app_client: Callable[..., TestClient], built_models: dict[str, Path]) -> None:
    client = make_app_client(hash_models=False)
    assert install(client, built_models["demo-krea2-gguf"]).json()["hash"] is None


def test_in_place_records_without_copying_and_delete_leaves_the_files(
    client: TestClient, built_models: dict[str, Path]
) -> None:
    source = built_models["demo-sd1"]
    record = install(client, source, inplace=True, name="here").json()
    assert record["path"] == str(source) and record["name"] == "here"
    assert models_dir_files(client) == []
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 204
    assert (source / "model_index.json").exists()
    assert client.get(f"{MODELS}/").json() == {"models": []}


def test_delete_removes_copied_files(client: TestClient, built_models: dict[str, Path]) -> None:
    record = install(client, built_models["demo-krea2-gguf"]).json()
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 204
    assert models_dir_files(client) == ["krea2"]
    assert client.get(f"{MODELS}/i/{record['key']}").status_code == 404
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 404
    assert built_models["demo-krea2-gguf"].exists()


def test_patch_renames_and_describes(client: TestClient, built_models: dict[str, Path]) -> None:
    key = install(client, built_models["demo-krea2-gguf"]).json()["key"]
    install(client, built_models["demo-sd1"])
    response = client.patch(f"{MODELS}/i/{key}", json={"name": "renamed", "description": "tiny"})
    assert response.status_code == 200, response.text
    assert (response.json()["name"], response.json()["description"]) == ("renamed", "tiny")
    assert client.patch(f"{MODELS}/i/{key}", json={}).json()["name"] == "renamed"
    conflict = client.patch(f"{MODELS}/i/{key}", json={"name": "DEMO-SD1"})
    assert conflict.status_code == 409 and "already exists" in conflict.json()["detail"]
    assert client.patch(f"{MODELS}/i/{key}", json={"name": "a/b"}).status_code == 422
    assert client.patch(f"{MODELS}/i/{key}", json={"path": "/x"}).status_code == 422
    assert client.patch(f"{MODELS}/i/nope", json={"description": "x"}).status_code == 404


def test_list_filters_by_family_and_type(client: TestClient, built_models: dict[str, Path]) -> None:
    demos = [(family, demo) for family in FAMILIES for demo in family.demos]
    for _, demo in demos:
        assert install(client, built_models[demo.name], inplace=True).status_code == 201
    names = lambda query: [m["name"] for m in client.get(f"{MODELS}/?{query}").json()["models"]]  # noqa: E731
    assert names("") == sorted(demo.name for _, demo in demos)
    for family in FAMILIES:
        assert names(f"family={family.name}") == sorted(demo.name for demo in family.demos)
        for kind in {demo.type for demo in family.demos}:
            listed = sorted(demo.name for demo in family.demos if demo.type == kind)
            assert names(f"family={family.name}&type={kind}") == listed
    assert client.get(f"{MODELS}/?family=sd-3").status_code == 422


def _truncated(built: Path, dest: Path) -> Path:
    data = built.read_bytes()
    dest.write_bytes(data[: len(data) * 2 // 3])
    return dest


def _folder_with_cut_weights(built: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(built, dest)
    weights = dest / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return dest


REFUSALS: dict[str, tuple[Callable[[dict[str, Path], Path], Path], str]] = {
    "unknown file": (lambda b, t: (t / "notes.txt").write_text("hello") and t / "notes.txt", "not a safetensors"),
    "pickle": (lambda b, t: (t / "m.ckpt").write_bytes(b"\x80\x04junk") and t / "m.ckpt", "pickle"),
    "truncated safetensors": (
        lambda b, t: _truncated(b["sd1-single"], t / "cut.safetensors"),
        "truncated",
    ),
    "truncated gguf": (lambda b, t: _truncated(b["demo-krea2-gguf"], t / "cut.gguf"), "corrupt or truncated GGUF"),
    "folder with cut weights": (
        lambda b, t: _folder_with_cut_weights(b["demo-sd1"], t / "cut-pipeline"),
        "cut-pipeline/unet/diffusion_pytorch_model.safetensors: truncated",
    ),
    "not a pipeline folder": (lambda b, t: (t / "empty").mkdir() or t / "empty", "no model_index.json"),
}


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_with_415_naming_why_leaving_nothing(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path, case: str, inplace: bool
) -> None:
    make, reason = REFUSALS[case]
    source = make(built_models, tmp_path)
    response = install(client, source, inplace=inplace)
    assert response.status_code == 415, response.text
    assert reason in response.json()["detail"]
    assert client.get(f"{MODELS}/").json() == {"models": []}
    assert models_dir_files(client) == []


def test_missing_relative_and_duplicate_sources(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    missing = install(client, tmp_path / "nothing-here")
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]
    assert install(client, "relative/path").status_code == 422
    assert install(client, built_models["demo-sd1"], name="bad/name").status_code == 422
    assert install(client, built_models["demo-sd1"]).status_code == 201
    duplicate = install(client, built_models["demo-sd1"])
    assert duplicate.status_code == 409 and "'demo-sd1' already exists" in duplicate.json()["detail"]
    assert models_dir_files(client) == ["sd-1", "sd-1/demo-sd1", *models_dir_files(client)[2:]]
    assert not [name for name in models_dir_files(client) if ".install-" in name]


def test_a_failed_copy_leaves_nothing(
    client: TestClient, built_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_chunks = model_install._chunks
    copied: list[Path] = []

    def failing_chunks(file: Path):  # type: ignore[no-untyped-def]
        copied.append(file)
        if len(copied) == 3:
            raise OSError(28, "No space left on device")
        yield from real_chunks(file)

    monkeypatch.setattr(model_install, "_chunks", failing_chunks)
    with pytest.raises(OSError, match="No space left"):
        install(client, built_models["demo-sd1"])
    assert client.get(f"{MODELS}/").json() == {"models": []}
    assert models_dir_files(client) == ["sd-1"]


def test_install_progress_and_completion_are_events(client: TestClient, built_models: dict[str, Path]) -> None:
    seen: list[EventBase] = []
    client.app.state.events.add_listener(seen.append)  # type: ignore[attr-defined]
    record = install(client, built_models["demo-sd1"]).json()
    progress = [e for e in seen if isinstance(e, ModelInstallProgressEvent)]
    assert progress[0].bytes_done == 0 and progress[-1].bytes_done == progress[-1].total_bytes == record["size"]
    complete = [e for e in seen if isinstance(e, ModelInstallCompleteEvent)]
    assert [(e.key, e.name, e.queue_id) for e in complete] == [(record["key"], "demo-sd1", None)]
    seen.clear()
    install(client, built_models["demo-sd1"])
    assert [e.event_name for e in seen] == ["model_install_error"]


def test_a_start_removes_what_a_killed_install_left(make_app_client: Callable[..., TestClient], tmp_path: Path) -> None:
    leftover = tmp_path / "root" / "models" / "sd-1" / ".install-x1y2" / "demo-sd1"
    leftover.mkdir(parents=True)
    (leftover / "model_index.json").write_text("{}")
    client = make_app_client()
    assert models_dir_files(client) == ["sd-1"]

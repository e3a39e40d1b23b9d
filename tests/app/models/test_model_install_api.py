"""POST /api/v2/models/install?source=... as InvokeAI does it: the job at once, the install in the background (GET
install, install/{id}), model_install_* events, cancel (DELETE install/{id}); refusals before any job, and failed or
cancelled jobs, leave no record and no files; the records routes (PATCH, DELETE) on the installed models."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from model_test_support import MODELS, install, installed, models_dir_files, wait_job

from invokeai.app.services import model_install
from invokeai.app.services.events import EventBase, EventBus
from invokeai.app.services.model_configs import ModelRecordChanges
from invokeai.app.services.model_install import InstallJobsFullError, ModelInstallService
from invokeai.app.services.model_records import ModelRecordService
from invokeai.app.services.sqlite import SqliteDatabase

KINDS = {
    # source name: (family, InvokeAI type, InvokeAI format, config_variant, pipeline, installed file or folder)
    "demo-sd1": ("sd-1", "main", "diffusers", None, True, "sd-1/demo-sd1"),
    "demo-krea2": ("krea2", "main", "diffusers", None, True, "krea2/demo-krea2"),
    "demo-krea2-gguf": ("krea2", "main", "gguf_quantized", "krea2-demo", False, "krea2/demo-krea2-gguf.gguf"),
    "sd1-single": ("sd-1", "main", "checkpoint", "sd-1-demo", True, "sd-1/sd1-single.safetensors"),
}


def listed(client: TestClient) -> list[dict]:
    return client.get(f"{MODELS}/").json()["models"]


@pytest.mark.parametrize("source", list(KINDS))
def test_each_kind_is_probed_copied_hashed_and_listed(
    client: TestClient, built_models: dict[str, Path], source: str
) -> None:
    family, type_, format_, variant, pipeline, installed_as = KINDS[source]
    response = install(client, built_models[source], description="mine")
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] in ("waiting", "running", "completed") and isinstance(job["id"], int)
    assert job["source"] == {"path": str(built_models[source]), "inplace": False, "type": "local"}
    assert job["config_in"]["description"] == "mine" and job["local_path"] == str(built_models[source])
    done = wait_job(client, job["id"])
    assert done["status"] == "completed", done
    record = done["config_out"]
    assert (record["family"], record["type"], record["format"]) == (family, type_, format_)
    assert (record["config_variant"], record["pipeline"]) == (variant, pipeline)
    assert (record["name"], record["source"], record["description"]) == (source, str(built_models[source]), "mine")
    assert record["source_type"] == "path"
    assert models_dir_files(client)[:2] == [family, installed_as]
    path = Path(record["path"])
    assert path == client.app.state.config.models_path / installed_as  # type: ignore[attr-defined]
    size = sum(f.stat().st_size for f in [path, *path.rglob("*")] if f.is_file())
    assert record["file_size"] == record["size"] == size == done["total_bytes"] == done["bytes"]
    assert record["hash"].startswith("sha256:") and len(record["hash"]) == 71
    if path.is_file():
        assert record["hash"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert client.get(f"{MODELS}/i/{record['key']}").json() == record
    assert listed(client) == [record]
    assert [j["id"] for j in client.get(f"{MODELS}/install").json()] == [job["id"]]


def test_folder_hash_covers_names_and_contents(client: TestClient, built_models: dict[str, Path]) -> None:
    first = installed(client, built_models["demo-sd1"], name="one")
    again = installed(client, built_models["demo-sd1"], name="two")
    assert first["hash"] == again["hash"]
    assert first["hash"] != installed(client, built_models["demo-krea2"])["hash"]


def test_hashing_can_be_turned_off(make_app_client: Callable[..., TestClient], built_models: dict[str, Path]) -> None:
    client = make_app_client(hash_models=False)
    # InvokeAI's hash is always a string: an empty one says there is none.
    assert installed(client, built_models["demo-krea2-gguf"])["hash"] == ""


def test_in_place_records_without_copying_and_delete_leaves_the_files(
    client: TestClient, built_models: dict[str, Path]
) -> None:
    source = built_models["demo-sd1"]
    record = installed(client, source, inplace=True, name="here")
    assert record["path"] == str(source) and record["name"] == "here"
    assert models_dir_files(client) == []
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 204
    assert (source / "model_index.json").exists()
    assert listed(client) == []


def test_delete_removes_copied_files(client: TestClient, built_models: dict[str, Path]) -> None:
    record = installed(client, built_models["demo-krea2-gguf"])
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 204
    assert models_dir_files(client) == ["krea2"]
    assert client.get(f"{MODELS}/i/{record['key']}").status_code == 404
    assert client.delete(f"{MODELS}/i/{record['key']}").status_code == 404
    assert built_models["demo-krea2-gguf"].exists()


def test_the_body_sets_what_invokeai_lets_a_user_set(client: TestClient, built_models: dict[str, Path]) -> None:
    record = installed(
        client,
        built_models["demo-sd1"],
        inplace=True,
        name="tuned",
        trigger_phrases=["sks style"],
        default_settings={"steps": 20, "cfg_scale": 6.5, "width": 768, "height": 512},
        base="sd-1",
        type="main",
    )
    assert (record["name"], record["trigger_phrases"]) == ("tuned", ["sks style"])
    assert {k: v for k, v in record["default_settings"].items() if v is not None} == {
        "steps": 20,
        "cfg_scale": 6.5,
        "width": 768,
        "height": 512,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"base": "sdxl"}, "base"),
        ({"type": "vae"}, "type"),
        ({"format": "checkpoint"}, "format"),
        ({"variant": "inpaint"}, "variant"),
    ],
)
def test_a_probed_field_other_than_the_files_is_refused(
    client: TestClient, built_models: dict[str, Path], body: dict, field: str
) -> None:
    response = install(client, built_models["demo-sd1"], inplace=True, **body)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]
    assert "worked out from the files" in response.json()["detail"][0]["msg"]
    assert client.get(f"{MODELS}/install").json() == [] and listed(client) == []


def test_fields_the_server_decides_are_refused(client: TestClient, built_models: dict[str, Path]) -> None:
    for body in ({"key": "mine"}, {"path": "/x"}, {"hash": "sha256:0"}, {"default_settings": {"steps": 0}}):
        response = install(client, built_models["demo-sd1"], **body)
        assert response.status_code == 422, (body, response.text)
    assert listed(client) == [] and models_dir_files(client) == []


def test_patch_renames_describes_and_sets_settings(client: TestClient, built_models: dict[str, Path]) -> None:
    key = installed(client, built_models["demo-krea2-gguf"])["key"]
    installed(client, built_models["demo-sd1"])
    response = client.patch(f"{MODELS}/i/{key}", json={"name": "renamed", "description": "tiny"})
    assert response.status_code == 200, response.text
    assert (response.json()["name"], response.json()["description"]) == ("renamed", "tiny")
    assert client.patch(f"{MODELS}/i/{key}", json={}).json()["name"] == "renamed"
    changed = client.patch(f"{MODELS}/i/{key}", json={"trigger_phrases": ["a", "b"], "default_settings": {"steps": 4}})
    assert changed.json()["trigger_phrases"] == ["a", "b"] and changed.json()["default_settings"]["steps"] == 4
    assert client.get(f"{MODELS}/i/{key}").json() == changed.json()
    # InvokeAI's UI sends the record back whole: the probed fields pass when unchanged, not when changed.
    same = {field: changed.json()[field] for field in ("base", "type", "format", "variant")}
    assert client.patch(f"{MODELS}/i/{key}", json=same).status_code == 200
    assert client.patch(f"{MODELS}/i/{key}", json={"base": "flux"}).status_code == 422
    conflict = client.patch(f"{MODELS}/i/{key}", json={"name": "DEMO-SD1"})
    assert conflict.status_code == 409 and "already exists" in conflict.json()["detail"]
    assert client.patch(f"{MODELS}/i/{key}", json={"name": "a/b"}).status_code == 422
    assert client.patch(f"{MODELS}/i/{key}", json={"path": "/x"}).status_code == 422
    assert client.patch(f"{MODELS}/i/nope", json={"description": "x"}).status_code == 404


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
    assert listed(client) == [] and client.get(f"{MODELS}/install").json() == []
    assert models_dir_files(client) == []


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("relative/path", "not an absolute path"),
        ("stabilityai/sdxl-turbo", "Hugging Face repo ids"),
        ("https://example.com/model.safetensors", "is a URL"),
        ("hf://org/repo", "is a URL"),
    ],
)
def test_a_source_that_is_not_a_local_path_is_refused_naming_what_is_allowed(
    client: TestClient, source: str, says: str
) -> None:
    response = install(client, source)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["query", "source"] and says in detail["msg"]
    assert "only an absolute path on the server" in detail["msg"]
    assert client.get(f"{MODELS}/install").json() == []


def test_missing_bad_name_and_duplicate_sources(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    missing = install(client, tmp_path / "nothing-here")
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]
    assert install(client, built_models["demo-sd1"], name="bad/name").status_code == 422
    assert client.post(f"{MODELS}/install", json={}).status_code == 422  # no source
    installed(client, built_models["demo-sd1"])
    duplicate = install(client, built_models["demo-sd1"])
    assert duplicate.status_code == 409 and "'demo-sd1' already exists" in duplicate.json()["detail"]
    assert models_dir_files(client) == ["sd-1", "sd-1/demo-sd1", *models_dir_files(client)[2:]]
    assert not [name for name in models_dir_files(client) if ".install-" in name]


def test_a_failed_copy_is_an_errored_job_that_leaves_nothing(
    client: TestClient, built_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_chunks = model_install._chunks
    copied: list[Path] = []

    def failing_chunks(file: Path) -> Iterator[bytes]:
        copied.append(file)
        if len(copied) == 3:
            raise OSError(28, "No space left on device")
        yield from real_chunks(file)

    monkeypatch.setattr(model_install, "_chunks", failing_chunks)
    seen: list[EventBase] = []
    client.app.state.events.add_listener(seen.append)  # type: ignore[attr-defined]
    job = wait_job(client, install(client, built_models["demo-sd1"]).json()["id"])
    assert (job["status"], job["error_reason"], job["config_out"]) == ("error", "OSError", None)
    assert "No space left" in job["error"] and "OSError" in job["error_traceback"]
    errors = [e for e in seen if e.event_name == "model_install_error"]
    assert [(e.id, e.error_type) for e in errors] == [(job["id"], "OSError")]  # type: ignore[attr-defined]
    assert listed(client) == []
    assert models_dir_files(client) == ["sd-1"]


def test_install_events_are_invokeais(client: TestClient, built_models: dict[str, Path]) -> None:
    seen: list[EventBase] = []
    client.app.state.events.add_listener(seen.append)  # type: ignore[attr-defined]
    job = wait_job(client, install(client, built_models["demo-sd1"]).json()["id"])
    record = job["config_out"]
    names = [e.event_name for e in seen]
    assert names[0] == "model_install_started" and names[-1] == "model_install_complete"
    assert set(names[1:-1]) == {"model_install_progress"}
    payloads = [e.model_dump(mode="json") for e in seen]
    assert all(p["id"] == job["id"] and p["source"] == job["source"] and p["queue_id"] is None for p in payloads)
    progress = payloads[1:-1]
    assert progress[0]["bytes"] == 0 and progress[-1]["bytes"] == progress[-1]["total_bytes"] == record["file_size"]
    complete = payloads[-1]
    assert (complete["key"], complete["total_bytes"], complete["config"]) == (
        record["key"],
        record["file_size"],
        record,
    )


def _blocking_chunks(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make every copy stop after its first chunk until `go` is set; `started` is set once one has."""
    real_chunks = model_install._chunks
    started, go = threading.Event(), threading.Event()

    def chunks(file: Path) -> Iterator[bytes]:
        for chunk in real_chunks(file):
            yield chunk
            started.set()
            assert go.wait(30)

    monkeypatch.setattr(model_install, "_chunks", chunks)
    return started, go


def test_cancel_stops_a_running_and_a_waiting_job_leaving_nothing(
    client: TestClient, built_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    started, go = _blocking_chunks(monkeypatch)
    seen: list[EventBase] = []
    client.app.state.events.add_listener(seen.append)  # type: ignore[attr-defined]
    running = install(client, built_models["demo-sd1"]).json()["id"]
    waiting = install(client, built_models["demo-krea2"]).json()["id"]
    assert started.wait(30)
    assert client.get(f"{MODELS}/install/{waiting}").json()["status"] == "waiting"
    assert client.get(f"{MODELS}/install/{running}").json()["status"] == "running"
    for job_id in (waiting, running):
        response = client.delete(f"{MODELS}/install/{job_id}")
        assert response.status_code == 201 and response.json() is None  # as InvokeAI answers
    go.set()
    assert [wait_job(client, job_id)["status"] for job_id in (running, waiting)] == ["cancelled", "cancelled"]
    cancelled = [e.id for e in seen if e.event_name == "model_install_cancelled"]  # type: ignore[attr-defined]
    assert sorted(cancelled) == sorted([running, waiting])
    assert not [e for e in seen if e.event_name == "model_install_complete"]
    assert listed(client) == []
    assert not [name for name in models_dir_files(client) if name not in ("sd-1", "krea2")]
    # A finished job stays as it finished; an unknown one is InvokeAI's 415 (GET: 404).
    assert client.delete(f"{MODELS}/install/{running}").status_code == 201
    assert client.get(f"{MODELS}/install/{running}").json()["status"] == "cancelled"
    assert client.delete(f"{MODELS}/install/9999").status_code == 415
    assert client.get(f"{MODELS}/install/9999").status_code == 404


def test_the_jobs_kept_are_bounded(built_models: dict[str, Path], tmp_path: Path) -> None:
    """Past max_jobs the oldest finished jobs go; with max_jobs unfinished, a new one is refused."""
    installer = ModelInstallService(
        ModelRecordService(SqliteDatabase(None)), tmp_path / "models", EventBus(), max_jobs=2
    )
    try:
        ids = []
        for name in ("a", "b", "c"):
            job = installer.submit(str(built_models["demo-krea2-gguf"]), config=ModelRecordChanges(name=name))
            ids.append(job.id)
            assert installer.wait(job.id, timeout=60).status == "completed"
        assert [job.id for job in installer.list_jobs()] == ids[1:]
        release = threading.Event()
        real_chunks = model_install._chunks

        def slow(file: Path) -> Iterator[bytes]:
            assert release.wait(30)
            yield from real_chunks(file)

        model_install._chunks = slow  # type: ignore[assignment]
        try:
            for name in ("d", "e"):
                installer.submit(str(built_models["demo-krea2-gguf"]), config=ModelRecordChanges(name=name))
            with pytest.raises(InstallJobsFullError, match="2 model installs are waiting or running"):
                installer.submit(str(built_models["demo-krea2-gguf"]), config=ModelRecordChanges(name="f"))
        finally:
            release.set()
            model_install._chunks = real_chunks  # type: ignore[assignment]
        assert len(installer.list_jobs()) == 2
    finally:
        installer.stop()


def test_scan_folder_lists_what_install_takes(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    root = tmp_path / "scan"
    (root / "nested" / ".hidden").mkdir(parents=True)
    shutil.copytree(built_models["demo-sd1"], root / "nested" / "pipeline")
    shutil.copy(built_models["demo-krea2-gguf"], root / "transformer.gguf")
    shutil.copy(built_models["demo-krea2-gguf"], root / "nested" / ".hidden" / "skipped.gguf")
    (root / "notes.txt").write_text("not a model")
    installed(client, root / "transformer.gguf", inplace=True)
    response = client.get(f"{MODELS}/scan_folder", params={"scan_path": str(root)})
    assert response.status_code == 200, response.text
    assert response.json() == [
        {"path": str(root / "transformer.gguf"), "is_installed": True},
        {"path": str(root / "nested" / "pipeline"), "is_installed": False},
    ]
    assert client.get(f"{MODELS}/scan_folder", params={"scan_path": str(root / "notes.txt")}).status_code == 400
    assert client.get(f"{MODELS}/scan_folder", params={"scan_path": str(tmp_path / "none")}).status_code == 400
    assert client.get(f"{MODELS}/scan_folder", params={"scan_path": "relative"}).status_code == 422
    assert client.get(f"{MODELS}/scan_folder").status_code == 422


def test_a_start_removes_what_a_killed_install_left(make_app_client: Callable[..., TestClient], tmp_path: Path) -> None:
    leftover = tmp_path / "root" / "models" / "sd-1" / ".install-x1y2" / "demo-sd1"
    leftover.mkdir(parents=True)
    (leftover / "model_index.json").write_text("{}")
    client = make_app_client()
    assert models_dir_files(client) == ["sd-1"]

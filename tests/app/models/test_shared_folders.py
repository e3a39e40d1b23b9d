"""outputs_dir and models_dir shared by several servers (docs/scale.md): a start removes only what a dead process of
this host left, or what nothing has written for a long time; a model whose files this host cannot see fails its item
with the host and the path."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from model_test_support import installed
from wait_support import wait_until

from invokeai.app.services.model_manager import ModelFilesMissingError
from invokeai.app.services.model_records import ModelIdentifier
from invokeai.app.services.owned_temporaries import STALE_AFTER_S, owner_tag, temporary_name

QUEUE = "/api/v1/queue/default"
SD_BODY = json.loads((Path(__file__).resolve().parents[3] / "docs" / "examples" / "sd_text_to_image.json").read_text())


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_start_keeps_another_live_servers_temporaries_and_removes_the_dead_ones(
    make_app_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    outputs, models = tmp_path / "root" / "outputs", tmp_path / "root" / "models" / "sd-1"
    (outputs / "thumbnails").mkdir(parents=True)
    models.mkdir(parents=True)
    host = owner_tag().rsplit("-", 1)[0]
    token = "0" * 32
    kept = [
        outputs / f".tmp-other-host-4242-{token}.png",  # another host's write in progress
        outputs / "thumbnails" / f".tmp-other-host-4242-{token}.webp",
        outputs / f".tmp-{host}-{os.getppid()}-{token}.png",  # a live process of this host
        models / ".install-other-host-4242-ab12cd_3",  # another host's install copying
    ]
    removed = [
        outputs / f".tmp-{host}-{dead_pid()}-{token}.png",  # this host's process is gone
        outputs / f".tmp-other-host-4242-{'1' * 32}.png",  # another host's, untouched for longer than the bound
        models / f".install-{host}-{dead_pid()}-xy98zz_1",
    ]
    for path in kept + removed:
        if path.name.startswith(".install-"):
            (path / "demo-sd1").mkdir(parents=True)
            (path / "demo-sd1" / "model_index.json").write_text("{}")
        else:
            path.write_bytes(b"partial")
    old = time.time() - STALE_AFTER_S - 60
    os.utime(removed[1], (old, old))
    make_app_client()
    assert [path.exists() for path in kept] == [True] * len(kept)
    assert [path.exists() for path in removed] == [False] * len(removed)


def test_temporaries_are_named_with_the_host_and_process() -> None:
    name = temporary_name(".tmp-", ".png")
    assert name.startswith(f".tmp-{owner_tag()}-") and name.endswith(".png")
    assert owner_tag().endswith(f"-{os.getpid()}")


@pytest.fixture
def sd1_copy(built_models: dict[str, Path], tmp_path: Path) -> Path:
    """demo-sd1 in a folder of its own, to be recorded in place and then hidden from this host."""
    copy = tmp_path / "shared-models" / "demo-sd1"
    shutil.copytree(built_models["demo-sd1"], copy)
    return copy


def test_a_model_this_host_cannot_see_fails_its_item_naming_the_host_and_path(
    make_app_client: Callable[..., TestClient], sd1_copy: Path
) -> None:
    client = make_app_client(run_processor=True)
    installed(client, sd1_copy, inplace=True)
    sd1_copy.rename(sd1_copy.with_name("unmounted"))  # the record stays: as on a host without the shared folder
    item_id = client.post(f"{QUEUE}/enqueue_batch", json=SD_BODY).json()["item_ids"][0]
    item = wait_until(
        lambda: (got := client.get(f"{QUEUE}/i/{item_id}").json())["status"] in ("failed", "completed") and got,
        timeout=30,
        what="the item to fail",
    )
    assert (item["status"], item["error_type"]) == ("failed", "ModelFilesMissingError")
    assert socket.gethostname() in item["error_message"] and str(sd1_copy) in item["error_message"]


def test_a_file_missing_inside_a_model_names_that_file(
    make_app_client: Callable[..., TestClient], sd1_copy: Path
) -> None:
    client = make_app_client()
    installed(client, sd1_copy, inplace=True)
    manager = client.app.state.services.models  # type: ignore[attr-defined]
    record = manager.resolve(ModelIdentifier(name="demo-sd1"))
    (sd1_copy / "unet" / "config.json").unlink()
    with pytest.raises(ModelFilesMissingError, match=f"unet/config.json cannot be read on host {socket.gethostname()}"):
        manager.config(record, "unet")

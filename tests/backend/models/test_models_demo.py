"""build_demo_models: deterministic bytes, seconds, atomic placement, refusal to overwrite."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from models_testlib import DemoBuild

from invokeai.backend.models import demo
from invokeai.backend.models.probe import probe_model


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(file.relative_to(root)): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(root.rglob("*"))
        if file.is_file()
    }


def test_build_is_deterministic_and_fast(demo_build: DemoBuild, tmp_path: Path) -> None:
    start = time.perf_counter()
    models = demo.build_demo_models(tmp_path)
    again = time.perf_counter() - start
    first, second = _hashes(demo_build.root), _hashes(tmp_path)
    assert first == second
    assert any(name.endswith(".safetensors") for name in first)
    # Seconds even on a busy 2-core machine (the first build includes importing the model classes).
    assert demo_build.seconds < 30 and again < 30
    assert [m.name for m in models] == [
        "demo-sd1",
        "demo-krea2",
        "demo-krea2-gguf",
        "demo-flux",
        "demo-flux-gguf",
        "demo-sdxl",
    ]
    # Each says of itself what probing its files says.
    for model in models:
        probe = probe_model(model.path)
        assert (probe.family, probe.type, probe.format) == (model.family, model.type, model.format)


def test_demo_models_are_described(demo_build: DemoBuild, tmp_path: Path) -> None:
    models = demo.build_demo_models(tmp_path, names=("demo-krea2-gguf",))
    assert [(m.name, m.family, m.type, m.format, m.path) for m in models] == [
        ("demo-krea2-gguf", "krea2", "transformer", "gguf", tmp_path / "demo-krea2-gguf.gguf")
    ]
    assert "random-weight" in models[0].description.lower()
    assert (demo_build.sd1 / "model_index.json").is_file() and demo_build.gguf.is_file()


def test_failed_build_leaves_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def flaky(name: str, into: Path) -> Path:
        calls.append(name)
        if len(calls) == 2:
            raise RuntimeError("killed mid-build")
        target = into / name
        target.mkdir()
        (target / "model_index.json").write_text("{}")
        return target

    monkeypatch.setattr(demo, "_build_one", flaky)
    with pytest.raises(RuntimeError, match="killed"):
        demo.build_demo_models(tmp_path)
    assert calls == ["demo-sd1", "demo-krea2"]
    assert list(tmp_path.iterdir()) == []


def test_existing_target_is_refused_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "demo-krea2").mkdir()
    monkeypatch.setattr(demo, "_build_one", lambda name, into: pytest.fail("built despite the conflict"))
    with pytest.raises(FileExistsError, match="demo-krea2"):
        demo.build_demo_models(tmp_path)
    with pytest.raises(ValueError, match="unknown demo model 'demo-xl'"):
        demo.build_demo_models(tmp_path, names=("demo-xl",))


def test_stale_staging_folder_is_removed(tmp_path: Path) -> None:
    stale = tmp_path / ".demo-build-killed"
    (stale / "demo-sd1").mkdir(parents=True)
    demo.build_demo_models(tmp_path, names=("demo-krea2-gguf",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-krea2-gguf.gguf"]

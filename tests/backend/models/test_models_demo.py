"""build_demo_models: deterministic bytes, seconds, atomic placement, refusal to overwrite."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from models_testlib import DemoBuild

from invokeai.backend.families.family import DemoModel, Family
from invokeai.backend.families.registry import FAMILIES
from invokeai.backend.models import demo
from invokeai.backend.models.probe import probe_model

DEMOS = [(family, model) for family in FAMILIES for model in family.demos]


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
    # Every registered family's demo models, in the registry's order.
    assert [(m.name, m.family) for m in models] == [(model.name, family.name) for family, model in DEMOS]


@pytest.mark.parametrize(("family", "model"), DEMOS, ids=[model.name for _, model in DEMOS])
def test_a_demo_is_what_probing_its_files_says(demo_build: DemoBuild, family: Family, model: DemoModel) -> None:
    probe = probe_model(demo_build.root / model.filename)
    assert (probe.family, probe.type, probe.format) == (family.name, model.type, model.format)
    assert "random-weight" in model.description.lower()


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
    assert calls == [model.name for _, model in DEMOS[:2]]
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

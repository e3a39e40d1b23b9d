"""Installing models: probe what a local path is, copy it under models_dir (or register it in place), hash it, record
it; and deleting them again.

An install is all or nothing: the copy goes to a hidden folder beside its destination and is renamed into place
only once complete, and any failure removes it, so a refused or failed install leaves neither a record nor files.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from invokeai.app.services.events import (
    EventBus,
    ModelInstallCompleteEvent,
    ModelInstallErrorEvent,
    ModelInstallProgressEvent,
)
from invokeai.app.services.model_records import (
    DuplicateModelNameError,
    ModelRecord,
    ModelRecordService,
    check_model_name,
)
from invokeai.app.services.owned_temporaries import is_leftover, owner_tag
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.probe import ProbeResult, probe_model
from invokeai.backend.models.safetensors_header import read_safetensors_header

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
PROGRESS_INTERVAL_S = 0.5
_STAGING_PREFIX = ".install-"


class ModelSourceNotFoundError(FileNotFoundError):
    pass


@dataclass
class _Progress:
    """Publishes install progress: at the start, at most every PROGRESS_INTERVAL_S, and at the end."""

    events: EventBus
    source: str
    name: str
    total: int
    done: int = 0
    _last: float = 0.0

    def advance(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S or self.done == self.total:
            self.publish(now)

    def publish(self, now: float | None = None) -> None:
        self._last = time.monotonic() if now is None else now
        self.events.publish(
            ModelInstallProgressEvent(source=self.source, name=self.name, bytes_done=self.done, total_bytes=self.total)
        )


def _files(path: Path) -> list[Path]:
    """The files of a model, folders in a stable order (the hash depends on it)."""
    if path.is_file():
        return [path]
    return sorted((file for file in path.rglob("*") if file.is_file()), key=lambda f: f.relative_to(path).as_posix())


def _chunks(file: Path) -> Iterator[bytes]:
    with file.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


def _combined_hash(root: Path, digests: list[tuple[Path, str]]) -> str:
    """One file: its sha256. A folder: the sha256 of its `sha256sum`-style listing (digest, two spaces, relative
    path, newline per file, by path), so the hash changes with any file's content or name."""
    if len(digests) == 1 and digests[0][0] == root:
        return f"sha256:{digests[0][1]}"
    listing = "".join(f"{digest}  {file.relative_to(root).as_posix()}\n" for file, digest in digests)
    return f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"


def _check_weights(probe: ProbeResult) -> None:
    """probe_model reads only the pipeline's index for a folder; a cut or garbled weights file inside it would
    otherwise be found only at the first generation."""
    if probe.path.is_dir():
        for file in probe.path.rglob("*.safetensors"):
            try:
                read_safetensors_header(file)
            except UnsupportedModelError as error:
                # The reason starts with the file's name; prefix the folders it is in.
                folder = file.parent.relative_to(probe.path.parent).as_posix()
                raise UnsupportedModelError(f"{folder}/{error.reason}") from None


def default_name(path: Path) -> str:
    return path.name if path.is_dir() else path.stem


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class ModelInstallService:
    def __init__(
        self,
        records: ModelRecordService,
        models_dir: Path,
        events: EventBus,
        *,
        hash_models: bool = True,
        on_delete: Callable[[ModelRecord], None] | None = None,
    ) -> None:
        self.records = records
        self.models_dir = models_dir
        self._events = events
        self._hash_models = hash_models
        self._on_delete = on_delete
        # Held from "is the name free" to "record added": two installs under one name cannot both pass the check.
        self._finish_lock = threading.Lock()

    def install(
        self, source: Path, *, inplace: bool = False, name: str | None = None, description: str | None = None
    ) -> ModelRecord:
        """Probe `source` and install it: copied to models_dir/<family>/<name> or, with `inplace`, recorded where it
        is. Raises ModelSourceNotFoundError, UnsupportedModelError, InvalidModelNameError or DuplicateModelNameError
        (each before anything is written), or whatever the copy raises (after removing what it wrote)."""
        source = Path(source).expanduser()
        label = name or default_name(source)
        try:
            if not source.exists():
                raise ModelSourceNotFoundError(f"model source {str(source)!r} not found")
            probe = probe_model(source)
            _check_weights(probe)
            name = check_model_name(name if name is not None else default_name(source))
            self._check_name_free(name)
            if inplace:
                record = self._register(probe, name, description, str(source), owned=False)
            else:
                record = self._copy_and_register(probe, name, description)
        except Exception as error:
            self._events.publish(
                ModelInstallErrorEvent(
                    source=str(source), name=label, error_type=type(error).__name__, error_message=str(error)
                )
            )
            raise
        self._events.publish(
            ModelInstallCompleteEvent(source=record.source, name=record.name, key=record.key, total_bytes=record.size)
        )
        logger.info("Installed model %r (%s %s, %s) from %s", name, record.family, record.type, record.format, source)
        return record

    def register_built(self, path: Path, name: str, description: str) -> ModelRecord:
        """Record a model the server built in place under models_dir (the demo models): owned, so deleting the
        record deletes the files."""
        return self._register(probe_model(path), name, description, str(path), owned=True)

    def _check_name_free(self, name: str) -> None:
        if self.records.exists(name):
            raise DuplicateModelNameError(f"a model named {name!r} already exists; choose another name")

    def _hash(self, probe: ProbeResult, progress: _Progress) -> str:
        digests = []
        for file in _files(probe.path):
            digest = hashlib.sha256()
            for chunk in _chunks(file):
                digest.update(chunk)
                progress.advance(len(chunk))
            digests.append((file, digest.hexdigest()))
        return _combined_hash(probe.path, digests)

    def _register(
        self, probe: ProbeResult, name: str, description: str | None, source: str, *, owned: bool
    ) -> ModelRecord:
        model_hash = None
        if self._hash_models:
            progress = _Progress(self._events, source, name, probe.size)
            progress.publish()
            model_hash = self._hash(probe, progress)
        record = self._record(probe, probe.path, name, description, source, model_hash)
        with self._finish_lock:
            self._check_name_free(name)
            return self.records.add(record, owned=owned)

    def _record(
        self, probe: ProbeResult, path: Path, name: str, description: str | None, source: str, model_hash: str | None
    ) -> ModelRecord:
        return ModelRecord(
            key=uuid.uuid4().hex,
            name=name,
            family=probe.family,  # type: ignore[arg-type]  # probe_model only reports the families records know
            type=probe.type,
            format=probe.format,  # type: ignore[arg-type]
            path=str(path),
            size=probe.size,
            hash=model_hash,
            source=source,
            description=description,
            config_variant=probe.config_variant,
        )

    def _copy_and_register(self, probe: ProbeResult, name: str, description: str | None) -> ModelRecord:
        family_dir = self.models_dir / probe.family
        family_dir.mkdir(parents=True, exist_ok=True)
        target = family_dir / (name if probe.path.is_dir() else name + probe.path.suffix.lower())
        if target.exists():
            raise DuplicateModelNameError(f"{target} already exists on disk; choose another name or remove it")
        # In the destination's folder, so that the final rename is atomic (one filesystem).
        # Named with this host and process: models_dir may be shared, and a server starting up must not take
        # another live server's copy in progress for a leftover (remove_stale_staging).
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{owner_tag()}-", dir=family_dir))
        try:
            staged = staging / target.name
            model_hash = self._copy(probe, staged, name)
            with self._finish_lock:
                self._check_name_free(name)
                if target.exists():
                    raise DuplicateModelNameError(f"{target} already exists on disk; choose another name")
                staged.rename(target)
                try:
                    record = self._record(probe, target, name, description, str(probe.path), model_hash)
                    return self.records.add(record, owned=True)
                except BaseException:
                    remove_path(target)
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _copy(self, probe: ProbeResult, dest: Path, name: str) -> str | None:
        """Copy the model's files to `dest`, hashing them on the way (one read of each byte)."""
        progress = _Progress(self._events, str(probe.path), name, probe.size)
        progress.publish()
        digests = []
        for file in _files(probe.path):
            out = dest if file == probe.path else dest / file.relative_to(probe.path)
            out.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256() if self._hash_models else None
            with out.open("wb") as handle:
                for chunk in _chunks(file):
                    handle.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    progress.advance(len(chunk))
            if digest is not None:
                digests.append((file, digest.hexdigest()))
        return _combined_hash(probe.path, digests) if self._hash_models else None

    def remove_stale_staging(self) -> None:
        """Remove the staging folders of installs that a killed server left half done: this host's whose process
        is gone, and any untouched for a long time (owned_temporaries.is_leftover). Another live server's install
        in progress in a shared models_dir is left alone."""
        for staging in self.models_dir.glob(f"*/{_STAGING_PREFIX}*"):
            if is_leftover(staging, _STAGING_PREFIX):
                logger.info("Removing %s, left by an install that did not finish", staging)
                shutil.rmtree(staging, ignore_errors=True)

    def delete(self, key: str) -> ModelRecord:
        """Delete the record; and its files when the server put them there (copied or built), never a model that
        was registered in place."""
        owned = self.records.is_owned(key)
        record = self.records.delete(key)
        if self._on_delete is not None:
            self._on_delete(record)
        path = Path(record.path)
        # Belt and braces: an owned record's path is under models_dir; never remove anything outside it.
        if owned and path.resolve().is_relative_to(self.models_dir.resolve()):
            try:
                remove_path(path)
            except OSError as error:
                logger.warning("Deleted model %r, but could not remove its files at %s: %s", record.name, path, error)
        return record

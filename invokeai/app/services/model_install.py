"""Installing models: probe what a local path is, copy it under models_dir (or register it in place), hash it, record
it; and deleting them again.

An install is a job, as in InvokeAI: `submit` probes the source and refuses at once what cannot be installed (a
missing path, a file of no supported kind, a name taken), then queues a ModelInstallJob that one background thread
runs (copy, hash, record), publishing model_install_* events; GET install/{id} reports on it, DELETE cancels it.
The jobs kept in memory are bounded (MAX_JOBS): the oldest finished ones go first.

An install is all or nothing: the copy goes to a hidden folder beside its destination and is renamed into place
only once complete, and any failure or cancel removes it, so a refused, failed or cancelled install leaves neither
a record nor files.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import re
import shutil
import tempfile
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from invokeai.app.services.events import (
    EventBus,
    ModelInstallCancelledEvent,
    ModelInstallCompleteEvent,
    ModelInstallErrorEvent,
    ModelInstallProgressEvent,
    ModelInstallStartedEvent,
)
from invokeai.app.services.model_configs import ModelConfig, ModelRecordChanges, model_config
from invokeai.app.services.model_install_jobs import TERMINAL, InstallStatus, LocalModelSource, ModelInstallJob
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
# Install jobs kept in memory: the oldest finished ones are dropped past this; with this many unfinished, a new one
# is refused (InstallJobsFullError, 429).
MAX_JOBS = 100
# A source named by a scheme (https://, hf://, s3:// ...): a URL, which is not installed here yet.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class ModelSourceNotFoundError(FileNotFoundError):
    pass


class UnsupportedSourceError(ValueError):
    """A source that is not an absolute path on the server (a URL, a Hugging Face repo id, a relative path)."""


class InstallJobNotFoundError(KeyError):
    pass


class InstallJobsFullError(RuntimeError):
    pass


class InstallCancelledError(Exception):
    pass


class ProbedFieldMismatchError(ValueError):
    """The request gave a field the files decide (base, type ...) with another value than theirs."""

    def __init__(self, mismatches: list[str]) -> None:
        super().__init__("; ".join(mismatches))
        self.mismatches = mismatches


def check_source(source: str) -> Path:
    """The local path `source` names; UnsupportedSourceError, saying what is allowed, for anything else."""
    if _URL.match(source):
        raise UnsupportedSourceError(
            f"source {source!r} is a URL: only an absolute path on the server is installed here (URLs and Hugging "
            "Face repo ids are not yet)"
        )
    path = Path(source).expanduser()
    if not path.is_absolute():
        raise UnsupportedSourceError(
            f"source {source!r} is not an absolute path: only an absolute path on the server is installed here "
            "(Hugging Face repo ids and URLs are not yet; a relative path would resolve against wherever the server "
            "started)"
        )
    return path


@dataclass
class _Progress:
    """Publishes install progress: at the start, at most every PROGRESS_INTERVAL_S, and at the end. Between chunks,
    raises InstallCancelledError once the job is cancelled."""

    events: EventBus
    job: _Job | None
    total: int
    done: int = 0
    _last: float = 0.0

    def advance(self, count: int) -> None:
        if self.job is not None and self.job.cancel_requested.is_set():
            raise InstallCancelledError
        self.done += count
        now = time.monotonic()
        if now - self._last >= PROGRESS_INTERVAL_S or self.done == self.total:
            self.publish(now)

    def publish(self, now: float | None = None) -> None:
        self._last = time.monotonic() if now is None else now
        if self.job is None:
            return  # a model the server builds itself (the demo models): no job to report on
        self.job.update(bytes=self.done, total_bytes=self.total)
        self.events.publish(
            ModelInstallProgressEvent(id=self.job.id, source=self.job.source, bytes=self.done, total_bytes=self.total)
        )


@dataclass
class _Job:
    """A job and what only the installer sees of it: its probe and the request's settings."""

    state: ModelInstallJob
    probe: ProbeResult
    name: str
    changes: dict
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> int:
        return self.state.id

    @property
    def source(self) -> LocalModelSource:
        return self.state.source

    def update(self, **values: object) -> None:
        with self.lock:
            for key, value in values.items():
                setattr(self.state, key, value)

    def snapshot(self) -> ModelInstallJob:
        with self.lock:
            return self.state.model_copy(deep=True)

    @property
    def finished(self) -> bool:
        with self.lock:
            return self.state.status in TERMINAL


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
        max_jobs: int = MAX_JOBS,
    ) -> None:
        self.records = records
        self.models_dir = models_dir
        self._events = events
        self._hash_models = hash_models
        self._on_delete = on_delete
        # Held from "is the name free" to "record added": two installs under one name cannot both pass the check.
        self._finish_lock = threading.Lock()
        self._max_jobs = max_jobs
        self._jobs: OrderedDict[int, _Job] = OrderedDict()
        self._jobs_lock = threading.Lock()
        self._next_id = 1
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._stopped = False

    # --- jobs

    def submit(
        self, source: str, *, inplace: bool = False, config: ModelRecordChanges | None = None
    ) -> ModelInstallJob:
        """Check and probe `source`, then queue its install and return the job at once (waiting). Raises, before
        any job exists: UnsupportedSourceError (not an absolute path), ModelSourceNotFoundError,
        UnsupportedModelError (no kind of model this server runs), InvalidModelNameError, DuplicateModelNameError,
        ProbedFieldMismatchError (config gives a base, type ... other than the files'), InstallJobsFullError."""
        config = config if config is not None else ModelRecordChanges()
        path = check_source(source)
        if not path.exists():
            raise ModelSourceNotFoundError(f"model source {str(path)!r} not found")
        probe = probe_model(path)
        _check_weights(probe)
        changes = config.stored()
        name = check_model_name(changes.pop("name", None) or default_name(path))
        self._check_name_free(name)
        mismatches = config.mismatches(self._preview(probe, name))
        if mismatches:
            raise ProbedFieldMismatchError(mismatches)
        with self._jobs_lock:
            if self._stopped:
                raise InstallJobsFullError("the server is stopping: no new installs")
            self._make_room()
            state = ModelInstallJob(
                id=self._next_id,
                config_in=config,
                inplace=inplace,
                source=LocalModelSource(path=str(path), inplace=inplace),
                local_path=str(path),
                total_bytes=probe.size,
            )
            self._next_id += 1
            job = _Job(state=state, probe=probe, name=name, changes=changes)
            self._jobs[job.id] = job
            self._start_worker()
        self._queue.put(job)
        logger.info("Queued install job %d of %s", job.id, path)
        return job.snapshot()

    def _preview(self, probe: ProbeResult, name: str) -> ModelConfig:
        """The record the files would give, for comparing with the request's fields."""
        return model_config(self._record(probe, probe.path, name, {}, str(probe.path), None))

    def _make_room(self) -> None:
        """Under _jobs_lock: drop the oldest finished jobs until one more fits; refuse when none is finished."""
        while len(self._jobs) >= self._max_jobs:
            finished = next((job_id for job_id, job in self._jobs.items() if job.finished), None)
            if finished is None:
                raise InstallJobsFullError(
                    f"{self._max_jobs} model installs are waiting or running; try again when one has finished"
                )
            del self._jobs[finished]

    def list_jobs(self) -> list[ModelInstallJob]:
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        return [job.snapshot() for job in jobs]

    def get_job(self, job_id: int) -> ModelInstallJob:
        return self._job(job_id).snapshot()

    def _job(self, job_id: int) -> _Job:
        with self._jobs_lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise InstallJobNotFoundError(f"no install job with id {job_id}")
        return job

    def cancel_job(self, job_id: int) -> ModelInstallJob:
        """Cancel a waiting or running job: it stops at its next chunk and leaves nothing behind. A finished job is
        left as it is (a completed install is undone by deleting the model)."""
        job = self._job(job_id)
        job.cancel_requested.set()
        return job.snapshot()

    def wait(self, job_id: int, timeout: float | None = None) -> ModelInstallJob:
        """The job once finished (or as it is when `timeout` seconds have passed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self._job(job_id)
        while not job.finished and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return job.snapshot()

    def _start_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="model-install", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        """Cancel what is waiting or running and end the worker (at server stop, before the database closes)."""
        with self._jobs_lock:
            self._stopped = True
            jobs = list(self._jobs.values())
            worker = self._worker
        for job in jobs:
            job.cancel_requested.set()
        if worker is not None:
            self._queue.put(None)
            worker.join()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._run(job)
            except Exception:  # _run reports every failure on the job; this keeps the worker alive regardless
                logger.exception("Install job %d failed unexpectedly", job.id)

    def _run(self, job: _Job) -> None:
        if job.cancel_requested.is_set():
            self._cancelled(job)
            return
        job.update(status=InstallStatus.RUNNING)
        self._events.publish(ModelInstallStartedEvent(id=job.id, source=job.source))
        try:
            if job.state.inplace:
                record = self._register(job.probe, job.name, job.changes, str(job.probe.path), owned=False, job=job)
            else:
                record = self._copy_and_register(job.probe, job.name, job.changes, job)
        except InstallCancelledError:
            self._cancelled(job)
            return
        except Exception as error:
            job.update(
                status=InstallStatus.ERROR,
                error_reason=type(error).__name__,
                error=str(error),
                error_traceback="".join(traceback.format_exception(error)),
            )
            logger.warning("Install job %d of %s failed: %s", job.id, job.probe.path, error)
            self._events.publish(
                ModelInstallErrorEvent(id=job.id, source=job.source, error_type=type(error).__name__, error=str(error))
            )
            return
        config = model_config(record)
        job.update(status=InstallStatus.COMPLETED, config_out=config, bytes=record.size, total_bytes=record.size)
        self._events.publish(
            ModelInstallCompleteEvent(
                id=job.id, source=job.source, key=record.key, total_bytes=record.size, config=config
            )
        )
        logger.info(
            "Installed model %r (%s %s, %s) from %s",
            record.name,
            record.family,
            record.type,
            record.format,
            record.source,
        )

    def _cancelled(self, job: _Job) -> None:
        job.update(status=InstallStatus.CANCELLED)
        logger.info("Install job %d of %s cancelled", job.id, job.probe.path)
        self._events.publish(ModelInstallCancelledEvent(id=job.id, source=job.source))

    # --- installing

    def register_built(self, path: Path, name: str, description: str) -> ModelRecord:
        """Record a model the server built in place under models_dir (the demo models): owned, so deleting the
        record deletes the files."""
        return self._register(probe_model(path), name, {"description": description}, str(path), owned=True)

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
        self, probe: ProbeResult, name: str, changes: dict, source: str, *, owned: bool, job: _Job | None = None
    ) -> ModelRecord:
        model_hash = None
        if self._hash_models:
            progress = _Progress(self._events, job, probe.size)
            progress.publish()
            model_hash = self._hash(probe, progress)
        if job is not None and job.cancel_requested.is_set():
            raise InstallCancelledError
        record = self._record(probe, probe.path, name, changes, source, model_hash)
        with self._finish_lock:
            self._check_name_free(name)
            return self.records.add(record, owned=owned)

    def _record(
        self, probe: ProbeResult, path: Path, name: str, changes: dict, source: str, model_hash: str | None
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
            config_variant=probe.config_variant,
            **changes,
        )

    def _copy_and_register(self, probe: ProbeResult, name: str, changes: dict, job: _Job) -> ModelRecord:
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
            model_hash = self._copy(probe, staged, job)
            with self._finish_lock:
                # The last moment a cancel counts: after this the model is installed.
                if job.cancel_requested.is_set():
                    raise InstallCancelledError
                self._check_name_free(name)
                if target.exists():
                    raise DuplicateModelNameError(f"{target} already exists on disk; choose another name")
                staged.rename(target)
                try:
                    record = self._record(probe, target, name, changes, str(probe.path), model_hash)
                    return self.records.add(record, owned=True)
                except BaseException:
                    remove_path(target)
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _copy(self, probe: ProbeResult, dest: Path, job: _Job) -> str | None:
        """Copy the model's files to `dest`, hashing them on the way (one read of each byte)."""
        progress = _Progress(self._events, job, probe.size)
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

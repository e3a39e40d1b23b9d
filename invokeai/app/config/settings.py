"""The settings class: every setting with its type, default, allowed values, description and restart rule.

Adding a setting is one `setting(...)` line here; the YAML template, the generated docs, the error messages and
`GET /api/v1/app/config` all read it from this class.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from invokeai.backend.attention.settings import AttentionSetting, AutotuneSetting

ENV_PREFIX = "INVOKEAI_"
ROOT_ENV_VAR = "INVOKEAI_ROOT"
CONFIG_FILE_NAME = "invokeai.yaml"

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
Precision = Literal["auto", "float16", "bfloat16", "float32"]
# Written `auto` or as a YAML list; NoDecode: the environment's text is parsed by _device_list, not as JSON, so
# INVOKEAI_GENERATION_DEVICES=auto and =cuda:0,cuda:1 both work.
GenerationDevices = Annotated[Literal["auto"] | list[str], NoDecode]
GENERATION_DEVICE_ENTRY = re.compile(r"cpu|mps|cuda:\d+")
GENERATION_DEVICES_ALLOWED = "auto, or a list of cpu, mps, cuda:N (e.g. [cuda:0, cuda:1]); cpu may repeat"
# The error type of a generation_devices value that is wrong in a way worth saying (config.errors shows the reason).
REASONED_ERROR = "setting_reason"
# A YAML list, or from the environment text such as "a,b" or "[a, b]" (NoDecode: not parsed as JSON).
TextList = Annotated[list[str], NoDecode]
# A host name as the Host header carries it, without its port; `*` (any) or `*.domain` (every subdomain).
ALLOWED_HOST_ENTRY = re.compile(r"\*|(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*")
ALLOWED_HOSTS_ALLOWED = (
    "a list of host names without a port (every port is accepted), e.g. [mybox.lan, *.example.com]; [*] turns "
    "the check off"
)
ALLOWED_ORIGIN_ENTRY = re.compile(r"https?://([a-z0-9_-]+(\.[a-z0-9_-]+)*|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")
ALLOWED_ORIGINS_ALLOWED = "a list of origins, scheme://host[:port] with http or https, e.g. [http://localhost:5173]"


def _refuse(reason: str) -> PydanticCustomError:
    return PydanticCustomError(REASONED_ERROR, "{reason}", {"reason": reason})


def default_root() -> Path:
    """The root when --root is not given: $INVOKEAI_ROOT, else ~/invokeai."""
    from_env = os.environ.get(ROOT_ENV_VAR)
    return Path(from_env).expanduser().resolve() if from_env else Path.home() / "invokeai"


def setting(
    default: Any,
    description: str,
    *,
    startup_only: bool,
    common: bool = False,
    allowed: str | None = None,
    secret: bool = False,
    **constraints: Any,
) -> Any:
    """A settings field.

    startup_only: read once at start; a change needs a restart (required, so each new setting decides).
    common: one a user is likely to edit; the first-run invokeai.yaml lists it (commented out).
    allowed: the valid values listed in words where a pattern checks them (e.g. "auto, cpu, cuda:N").
    secret: its value is never shown: not by GET /api/v1/app/config, not in error messages or logs.
    """
    extra: dict[str, Any] = {"startup_only": startup_only, "common": common, "secret": secret}
    if allowed is not None:
        extra["allowed"] = allowed
    return Field(default, description=description, json_schema_extra=extra, **constraints)


_DECIMAL_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _is_finite(value: float | int) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _as_written(value: Any, info: ValidationInfo) -> Any:
    """Refuse the conversions pydantic makes that would surprise in a setting: a boolean as a number (`port: true`
    is not port 1), a fraction as an integer, number strings in Python's syntax ("1_000", "0x10", "inf"), an
    infinite or NaN number, and an empty path (which pydantic reads as ".", the root itself)."""
    kind = InvokeAIAppConfig.model_fields[str(info.field_name)].annotation
    if kind in (int, float):
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number")
        if isinstance(value, str):
            if not (_DECIMAL_INTEGER if kind is int else _DECIMAL_NUMBER).fullmatch(value.strip()):
                raise ValueError("not a decimal number")
            value = int(value) if kind is int else float(value)
        if kind is int and isinstance(value, float):
            raise ValueError("not an integer")
        if isinstance(value, (int, float)) and not _is_finite(value):
            raise ValueError("not a finite number")
    if kind is Path and isinstance(value, str) and not value.strip():
        raise ValueError("an empty path")
    return value


def _switch(value: Any) -> Any:
    """attention_autotune as written: YAML reads an unquoted `on` or `off` as a boolean."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def _device_list(value: Any) -> Any:
    """generation_devices as a list of entries (or "auto"): a YAML list, or text such as "cuda:0,cuda:1" or
    "[cpu, cpu]" from the environment. Each entry is checked here; whether this machine has it, at startup."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return "auto"
        value = [part.strip() for part in text.strip("[]").split(",") if part.strip()]
    if not isinstance(value, list):
        raise _refuse(f"not a list; allowed: {GENERATION_DEVICES_ALLOWED}")
    if not value:
        raise _refuse(f"an empty list names no device; allowed: {GENERATION_DEVICES_ALLOWED}")
    entries = []
    for entry in value:
        text = entry.strip().lower() if isinstance(entry, str) else None
        if text is None or not GENERATION_DEVICE_ENTRY.fullmatch(text):
            raise _refuse(f"{entry!r} is not a generation device; allowed: {GENERATION_DEVICES_ALLOWED}")
        entries.append(text)
    # Two workers on one GPU would fight over its memory; the CPU's workers share its cores, which is allowed.
    repeated = sorted({entry for entry in entries if entry != "cpu" and entries.count(entry) > 1})
    if repeated:
        raise _refuse(f"{', '.join(repeated)} is listed more than once; only cpu may repeat")
    return entries


def _text_list(value: Any) -> Any:
    """A list setting's entries from a YAML list, or from text such as "a,b" or "[a, b]" (the environment)."""
    if isinstance(value, str):
        value = [part.strip().strip("'\"") for part in value.strip().strip("[]").split(",")]
        value = [part for part in value if part]
    return value


def _entries(value: Any, pattern: re.Pattern[str], allowed: str) -> list[str]:
    """The entries of a list setting, lower-cased, each one matching `pattern`."""
    value = _text_list(value)
    if not isinstance(value, list):
        raise _refuse(f"not a list; allowed: {allowed}")
    entries = []
    for entry in value:
        text = entry.strip().lower() if isinstance(entry, str) else None
        if text is None or not pattern.fullmatch(text):
            raise _refuse(f"{entry!r} is not allowed; allowed: {allowed}")
        entries.append(text)
    return entries


def _allowed_hosts(value: Any) -> list[str]:
    return _entries(value, ALLOWED_HOST_ENTRY, ALLOWED_HOSTS_ALLOWED)


def _allowed_origins(value: Any) -> list[str]:
    return _entries(value, ALLOWED_ORIGIN_ENTRY, ALLOWED_ORIGINS_ALLOWED)


class InvokeAIAppConfig(BaseSettings):
    """InvokeAI's settings. Sources, highest first: command line, environment, the YAML file, defaults.

    Build it through `invokeai.app.config.load_config`, which checks each source and sets `root`; on its own
    the class reads the environment (INVOKEAI_<SETTING>) over the defaults.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, extra="forbid")
    _as_written = field_validator("*", mode="before")(_as_written)
    _device_list = field_validator("generation_devices", mode="before")(_device_list)
    _allowed_hosts = field_validator("allowed_hosts", mode="before")(_allowed_hosts)
    _allowed_origins = field_validator("allowed_origins", mode="before")(_allowed_origins)
    _switch = field_validator("attention_autotune", mode="before")(_switch)

    host: str = setting(
        "127.0.0.1",
        "Address the web server listens on. 0.0.0.0 serves every network interface; clients that reach it by a "
        "name other than the machine's host name need that name in allowed_hosts.",
        startup_only=True,
        common=True,
        allowed="a host name or IP address, e.g. 127.0.0.1, 0.0.0.0, ::, localhost (not empty)",
        pattern=r"^\S+$",
    )
    port: int = setting(
        9090,
        "TCP port the web server listens on. 0 lets the operating system pick a free port.",
        startup_only=True,
        common=True,
        ge=0,
        le=65535,
    )
    log_level: LogLevel = setting(
        "info",
        "Lowest level of log messages that are printed.",
        startup_only=True,
        common=True,
    )
    device: str = setting(
        "auto",
        "Torch device that runs the models: auto chooses the best one available; cuda:N picks one CUDA GPU.",
        startup_only=True,
        common=True,
        allowed="auto, cpu, cuda, cuda:N, mps, xpu",
        pattern=r"^(auto|cpu|cuda|cuda:\d+|mps|xpu)$",
    )
    generation_devices: GenerationDevices = setting(
        "auto",
        "Devices that run queue items, one session worker (thread) each, so that several items run at once. auto: "
        "every CUDA GPU; without one, a single worker on the device that `device` picks. A list names them, e.g. "
        "[cuda:0, cuda:1]. A GPU may be listed once; cpu may repeat (two CPU workers share the cores). Every "
        "worker shares one RAM model cache; each keeps its own models on its device.",
        startup_only=True,
        common=True,
        allowed=GENERATION_DEVICES_ALLOWED,
    )
    precision: Precision = setting(
        "auto",
        "Floating-point precision of model weights and computation: auto chooses one that suits the device.",
        startup_only=True,
        common=True,
    )
    attention_backend: AttentionSetting = setting(
        "auto",
        "Attention kernel ranked first for every scaled-dot-product attention call. auto: InvokeAI's order for "
        "the GPU at hand (cuDNN, flash, memory-efficient, math on sm90 and sm100 with cuDNN newer than 9.15.0, "
        "as PyTorch ranks them; flash, cuDNN, memory-efficient, math elsewhere; docs/attention.md says why). sage: "
        "SageAttention where it can serve the call (needs the "
        "'sage' extra and a CUDA GPU), auto's order elsewhere. cudnn, flash, efficient, math: that PyTorch "
        "kernel first, then auto's order; a call it cannot serve runs on the next kernel and is reported. "
        "math computes the whole score matrix: slow and memory-hungry, meant for debugging.",
        startup_only=True,
        common=True,
    )
    attention_autotune: AutotuneSetting = setting(
        "off",
        "Measured autotuning of the attention kernel. on: the first attention call of each shape bucket (device, "
        "dtype, head size, heads, grouped-query or not, mask kind, lengths rounded up to powers of two) times every "
        "kernel that can serve it, a few runs within a bounded budget, and the fastest serves the bucket's later "
        "calls (a call it cannot serve runs on the ranked order). The choices are kept in "
        "<root>/attention_autotune.json per GPU, torch and cuDNN version, and reused at the next start. A pinned "
        "attention_backend (cudnn, flash, efficient, math) overrides it. off: the ranked order alone.",
        startup_only=True,
    )
    models_dir: Path = setting(
        Path("models"),
        "Folder that holds installed models.",
        startup_only=True,
        common=True,
    )
    install_demo_models: bool = setting(
        True,
        "On a start with no model installed, build and install every model family's tiny random-weight demo models "
        "under models_dir, so that the first generation needs no download (GET /api/v1/app/families lists each "
        "family's demo models; docs/families.md). Their images are noise: they exercise the pipelines, they do not "
        "make pictures.",
        startup_only=True,
        common=True,
    )
    hash_models: bool = setting(
        True,
        "Compute a sha256 of every model as it is installed (shown as its hash). Off: installs of large models "
        "are faster and their hash is null.",
        startup_only=True,
    )
    max_cache_ram_gb: float = setting(
        8.0,
        "Most RAM, in GB, that loaded models may take. Beyond it, the least recently used models are dropped "
        "and loaded again from disk when next needed.",
        startup_only=True,
        common=True,
        ge=0,
    )
    device_working_mem_gb: float = setting(
        3.0,
        "Least device memory, in GB, kept free beside the models for a node's computation. A node that needs "
        "more (by its estimate) gets more: other models are moved off the device first.",
        startup_only=True,
        ge=0,
    )
    outputs_dir: Path = setting(
        Path("outputs"),
        "Folder that generated images are written to.",
        startup_only=True,
        common=True,
    )
    db_path: Path = setting(
        Path("databases/invokeai.db"),
        "SQLite database file (queue, image records, model records).",
        startup_only=True,
    )
    use_memory_db: bool = setting(
        False,
        "Keep the database in memory instead of db_path; everything in it is lost on exit. For tests and demos.",
        startup_only=True,
    )
    database_url: str = setting(
        "",
        "PostgreSQL database that holds the session queue, the image records and the model records, as "
        "postgresql://user[:password]@host[:port]/database (postgres:// also). Several servers may name the same "
        "database: they share one queue, and each item runs on exactly one of them. Empty: the SQLite file at "
        "db_path. Cannot be combined with use_memory_db. Pool, leases and shared folders: docs/configuration.md, "
        "PostgreSQL.",
        startup_only=True,
        allowed="postgresql://user[:password]@host[:port]/database, postgres://..., or empty (the SQLite file)",
        secret=True,
        pattern=r"^(|postgres(ql)?://[^/\s]+/[^/\s?]+(\?\S*)?)$",
    )
    database_pool_size: int = setting(
        20,
        "Most connections a server opens to the PostgreSQL database (database_url): one for each session worker and "
        "each API request being answered at once, and one for the lease keeper; a request waits for a free one. "
        "Every server on the database takes up to this many of the PostgreSQL server's max_connections.",
        startup_only=True,
        ge=2,
        le=1000,
    )
    queue_lease_seconds: int = setting(
        30,
        "While a queue item runs, its server renews the item's lease every third of this time. An item whose "
        "lease ran out belongs to a server that stopped (killed, crashed, lost power): any server on the database "
        "then cancels it or requeues it (requeue_interrupted). Longer: fewer renewals, a later recovery.",
        startup_only=True,
        ge=3,
        le=3600,
    )
    requeue_interrupted: bool = setting(
        False,
        "What becomes of an item whose server stopped while it was running (its lease ran out, or on SQLite, "
        "the server restarted): false: it is canceled, with a reason that says its server stopped; true: it is put "
        "back as pending, to run again from its start.",
        startup_only=True,
    )
    max_queue_size: int = setting(
        10000,
        "Most queue items that may be pending at once. A batch that would take the queue past it is refused "
        "whole (HTTP 429).",
        startup_only=True,
        ge=1,
        le=1_000_000,
    )
    max_graph_nodes: int = setting(
        10000,
        "Most nodes a batch's graph may have. A larger graph is refused (HTTP 422 naming this limit and the "
        "count) before it is validated, so that one request cannot take the server's CPU for long; real "
        "workflows have tens to hundreds of nodes.",
        startup_only=True,
        ge=1,
        le=1_000_000,
    )
    node_cache_size: int = setting(
        512,
        "Most node outputs the invocation cache keeps in memory (InvokeAI's setting): a node whose use_cache is "
        "true takes the output a node of its type with the same inputs made before, instead of running. The least "
        "recently used outputs go first; the tensors they name are kept for them, in at most half of the tensor "
        "store. 0 turns the cache off. GET /api/v1/app/invocation_cache/status shows its size, hits and misses.",
        startup_only=True,
        ge=0,
        le=1_000_000,
    )
    max_upload_mb: int = setting(
        50,
        "Largest image file, in megabytes, that POST /api/v1/images/upload accepts (HTTP 413 beyond).",
        startup_only=True,
        ge=1,
        le=2048,
    )
    web_ui: str = setting(
        "builtin",
        "The web UI served at /: builtin (this server's own), or invokeai:<folder>, a built InvokeAI frontend (the "
        "invokeai/frontend/web/dist folder of InvokeAI's wheel, e.g. 6.14.2's; never shipped with this server). A "
        "relative folder is under the root.",
        startup_only=True,
        allowed="builtin, invokeai:<folder>",
        pattern=r"^(builtin|invokeai:\S.*)$",
    )
    api_token: str = setting(
        "",
        "When set, every API request and event stream must send the header 'Authorization: Bearer <api_token>' "
        "(HTTP 401 otherwise). Empty: no token is needed. Secret: never shown by /api/v1/app/config or logged. "
        "Set it whenever host is not 127.0.0.1.",
        startup_only=True,
        secret=True,
    )
    allowed_hosts: TextList = setting(
        [],
        "Host names that requests may name in their Host header (any port), besides those always accepted: "
        "localhost, any IP address, the host setting when it is a name, and with host 0.0.0.0 or :: this "
        "machine's host name. A request naming another host is refused (HTTP 400): a page whose name an "
        "attacker points at this machine (DNS rebinding) sends its own name, so it cannot use the API. List the "
        "names clients reach this server by, e.g. [mybox.lan]; *.example.com accepts every subdomain; [*] turns "
        "the check off (for a proxy in front that checks it). docs/api.md, Security.",
        startup_only=True,
        allowed=ALLOWED_HOSTS_ALLOWED,
    )
    allowed_origins: TextList = setting(
        [],
        "Origins of other web pages (scheme://host[:port]) that may send requests that change something (every "
        "method but GET, HEAD and OPTIONS, uploads included) and read the answers (CORS). Such a request from a "
        "page of any other origin is refused (HTTP 403); pages of this server's own origin, and clients that are "
        "not browsers (no Origin header), need nothing here. E.g. [http://localhost:5173] for web/'s vite dev "
        "server, whose proxy sends the page's origin. docs/api.md, Security.",
        startup_only=True,
        allowed=ALLOWED_ORIGINS_ALLOWED,
    )

    # Where relative paths resolve and which file was read: not settings (the file cannot name its own
    # location), so load_config sets them.
    _root: Path = PrivateAttr(default_factory=default_root)
    _config_file: Path | None = PrivateAttr(default=None)

    @property
    def root(self) -> Path:
        return self._root

    @property
    def config_file(self) -> Path | None:
        return self._config_file

    def resolve(self, path: Path) -> Path:
        """A path setting made absolute: relative paths resolve against the root."""
        return path if path.is_absolute() else self._root / path

    @property
    def models_path(self) -> Path:
        return self.resolve(self.models_dir)

    @property
    def web_ui_dir(self) -> Path | None:
        """The folder of another web UI to serve (web_ui: invokeai:<folder>), or None for the built-in one."""
        kind, _, folder = self.web_ui.partition(":")
        return self.resolve(Path(folder).expanduser()) if kind == "invokeai" else None

    @property
    def outputs_path(self) -> Path:
        return self.resolve(self.outputs_dir)

    @property
    def db_file(self) -> Path:
        return self.resolve(self.db_path)

    @classmethod
    def located(cls, values: dict[str, Any], root: Path, config_file: Path | None) -> InvokeAIAppConfig:
        """Settings from already merged `values` (which take precedence over the environment), with the root
        that relative paths resolve against and the settings file they came from."""
        config = cls(**values)
        config._root = root
        config._config_file = config_file
        return config


# The same fields on a plain model, to validate one source's values on their own: BaseSettings always mixes
# the environment in, so it cannot say whether the file's own value was valid.
SettingsValues: type[BaseModel] = create_model(
    "SettingsValues",
    __config__=ConfigDict(extra="forbid"),
    __validators__={
        "_as_written": field_validator("*", mode="before")(_as_written),
        "_device_list": field_validator("generation_devices", mode="before")(_device_list),
        "_allowed_hosts": field_validator("allowed_hosts", mode="before")(_allowed_hosts),
        "_allowed_origins": field_validator("allowed_origins", mode="before")(_allowed_origins),
        "_switch": field_validator("attention_autotune", mode="before")(_switch),
    },
    **{name: (field.annotation, field) for name, field in InvokeAIAppConfig.model_fields.items()},
)

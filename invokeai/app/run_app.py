"""`invokeai-web`: command line -> settings -> root -> logging -> attention kernels -> API app -> uvicorn."""

from __future__ import annotations

import logging
import sys

from invokeai.app.config import ConfigError, LoadResult, init_root, load_config, parse_args
from invokeai.app.config.machine import check_machine
from invokeai.app.logging_setup import configure_logging
from invokeai.app.server import exit_quietly_on_signals, serve
from invokeai.app.version import app_version

logger = logging.getLogger("invokeai.app.run_app")

EXIT_BAD_CONFIG = 2


def _log_start(loaded: LoadResult, first_run: bool) -> None:
    config = loaded.config
    logger.info("InvokeAI %s, root %s", app_version(), config.root)
    if first_run:
        logger.info("First start: wrote %s (every setting is commented out, at its default)", config.config_file)
    if loaded.migrated_from is not None:
        logger.info(
            "Migrated %s from schema_version %d; the original is %s",
            config.config_file,
            loaded.migrated_from,
            loaded.backup,
        )
        for note in loaded.notes:
            logger.info("Migration: %s", note)


def _refuse(error: ConfigError) -> int:
    for problem in error.problems:
        print(f"invokeai-web: error: {problem}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def main(argv: list[str] | None = None) -> int:
    exit_quietly_on_signals()
    args = parse_args(argv, app_version())
    try:
        loaded = load_config(args)
        first_run = init_root(loaded.config)
    except ConfigError as error:
        return _refuse(error)
    config = loaded.config
    configure_logging(config.log_level)
    _log_start(loaded, first_run)
    for warning in loaded.warnings:
        logger.warning("%s", warning)
    # After the first log line: the device check imports torch, which takes seconds.
    try:
        check_machine(loaded)
    except ConfigError as error:
        return _refuse(error)

    # Imported here rather than at the top: --help and configuration errors need not wait for torch, and the
    # attention kernels must be installed before anything imports diffusers, transformers or model code.
    from invokeai.backend.attention import AUTOTUNE_FILE_NAME, install_attention

    # The startup probe asks the configured device what kernels it has; auto lets the package pick the accelerator.
    # Tuned choices are kept under the root, so that a restart on the same GPU, torch and cuDNN reuses them.
    install_attention(
        config.attention_backend,
        device=None if config.device == "auto" else config.device,
        autotune=config.attention_autotune == "on",
        autotune_file=config.root / AUTOTUNE_FILE_NAME,
    )

    from invokeai.app.api.app_factory import create_app

    app = create_app(config, demo_models=True, warm_up=True)
    serve(app, config.host, config.port, on_exit=app.state.events.close)
    logger.info("Stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

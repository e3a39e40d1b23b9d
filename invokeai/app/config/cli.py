"""The `invokeai-web` command line: where the root and the settings file are, and the settings it may override."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invokeai.app.config.describe import description
from invokeai.app.config.settings import CONFIG_FILE_NAME, ROOT_ENV_VAR

# Settings that also have a command-line option (--host, --port); their help is the setting's description. Their
# values stay strings here: the settings validate them as they do the environment's, so that "--port 1_000" is
# refused as INVOKEAI_PORT=1_000 is (argparse's int() would take it as 1000), with the same message.
CLI_SETTINGS = ("host", "port")


@dataclass(frozen=True)
class CliArgs:
    root: Path | None = None
    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # the CLI_SETTINGS given on the command line


def build_parser(version: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="invokeai-web",
        description="Start the InvokeAI web server.",
        epilog=f"Every setting can be set in {CONFIG_FILE_NAME} or as an environment variable INVOKEAI_<SETTING>; "
        "see docs/configuration.md. Precedence: command line, environment, file, default.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        metavar="DIR",
        help=f"InvokeAI root folder, created on first start (default: ${ROOT_ENV_VAR}, else ~/invokeai).",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"Settings file to read instead of <root>/{CONFIG_FILE_NAME}; it must exist.",
    )
    for name in CLI_SETTINGS:
        parser.add_argument(
            f"--{name}",
            metavar=name.upper(),
            help=f"{description(name)} (setting {name!r})",
        )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    return parser


def parse_args(argv: list[str] | None, version: str) -> CliArgs:
    """The parsed command line; argparse itself exits with code 2 on a malformed one (an unknown option, a missing
    value). The values of the CLI_SETTINGS are checked by load_config."""
    namespace = build_parser(version).parse_args(argv)
    overrides = {name: getattr(namespace, name) for name in CLI_SETTINGS if getattr(namespace, name) is not None}
    return CliArgs(root=namespace.root, config=namespace.config, overrides=overrides)

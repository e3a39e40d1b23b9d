"""InvokeAI's configuration: the settings class, invokeai.yaml, the command line and the generated docs."""

from invokeai.app.config.cli import CliArgs, parse_args
from invokeai.app.config.errors import ConfigError
from invokeai.app.config.loader import LoadResult, init_root, load_config
from invokeai.app.config.settings import InvokeAIAppConfig

__all__ = [
    "CliArgs",
    "ConfigError",
    "InvokeAIAppConfig",
    "LoadResult",
    "init_root",
    "load_config",
    "parse_args",
]

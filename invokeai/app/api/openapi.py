"""The OpenAPI document, printed: `python -m invokeai.app.api.openapi > openapi.json`.

openapi.json at the repository root is this output; tests/app/api/test_openapi_document.py fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig


def openapi_document() -> dict[str, Any]:
    # model_construct: the defaults, without reading the environment; building the app touches nothing on disk.
    return create_app(InvokeAIAppConfig.model_construct()).openapi()


def render() -> str:
    return json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write invokeai.yaml.example and docs/configuration.md from the settings class; --check only compares."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from invokeai.app.config.generate import GENERATED_FILES

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs; write nothing")
    args = parser.parse_args()
    stale = []
    for relative, render in GENERATED_FILES.items():
        path = REPO / relative
        text = render()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(relative)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for relative in stale:
        print(f"{'stale' if args.check else 'wrote'}: {relative}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""What every family's demo builder shares: the seed its tiny random-weight components start from.

Family demo modules (`invokeai/backend/families/<family>/demo.py`) import this; `invokeai.backend.models.demo`,
which builds and places the demo models of every registered family, reads the registry and is imported by none of
them.
"""

from __future__ import annotations

import torch

SEED = 20240601


def seeded() -> None:
    """Every component starts from the same generator state, so its weights do not depend on build order."""
    torch.manual_seed(SEED)

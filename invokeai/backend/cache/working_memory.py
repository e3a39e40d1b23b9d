"""Working-memory estimators for every model family and operation: what the model cache reserves on the execution
device before a node runs.

Each family declares its estimators (`Family.estimators`, keyed by operation: a component, or vae_decode and
vae_encode). An estimator `(config, facts)` returns a `WorkingMemory`: an activation term plus the attention calls
the operation makes, each priced through `sdpa_score_matrix_bytes`, so a call the installed dispatcher sends to
math is reserved for. The config is the component's (a diffusers FrozenDict, a transformers PretrainedConfig) or its
parsed config.json. How each family's terms are derived and calibrated is in its estimators module.
"""

from __future__ import annotations

from invokeai.backend.cache.estimate import AttentionCall, CallFacts, ConfigLike, Estimator, WorkingMemory
from invokeai.backend.families import FAMILIES, get_family

__all__ = [
    "ESTIMATORS",
    "AttentionCall",
    "CallFacts",
    "WorkingMemory",
    "estimate_working_memory",
    "model_component",
]

# Every family's estimators, keyed (family, operation): what the calibration script and the tests iterate.
ESTIMATORS: dict[tuple[str, str], Estimator] = {
    (family.name, operation): estimate for family in FAMILIES for operation, estimate in family.estimators.items()
}


def model_component(family: str, operation: str) -> str:
    """The model component an operation runs: vae_decode -> vae, a component -> itself."""
    return get_family(family).component_of(operation)


def estimate_working_memory(family: str, operation: str, config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    try:
        estimate = ESTIMATORS[(family, operation)]
    except KeyError:
        known = ", ".join(f"{f}/{o}" for f, o in sorted(ESTIMATORS))
        raise KeyError(f"no working-memory estimator for {family}/{operation}; known: {known}") from None
    return estimate(config, facts)

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

__all__ = [
    "AttentionCall",
    "CallFacts",
    "WorkingMemory",
    "estimate_working_memory",
    "estimator",
]


def estimator(family: str, operation: str) -> Estimator:
    from invokeai.backend.families import get_family

    estimators = get_family(family).estimators
    if operation not in estimators:
        known = ", ".join(sorted(estimators))
        raise KeyError(f"no working-memory estimator for {family}/{operation}; known: {known}")
    return estimators[operation]


def estimate_working_memory(family: str, operation: str, config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    return estimator(family, operation)(config, facts)

"""Working-memory estimators for every model family and component: what the model cache reserves on the execution
device before a node runs.

`ESTIMATORS[(family, component)](config, facts)` returns a `WorkingMemory`: an activation term plus the attention
calls the component makes, each priced through `sdpa_score_matrix_bytes`, so a call the installed dispatcher sends
to math is reserved for. The config is the loaded component's (a diffusers FrozenDict, a transformers
PretrainedConfig) or its parsed config.json. How each family's terms are derived and calibrated is in its module.
"""

from __future__ import annotations

from invokeai.backend.cache import estimators_krea2, estimators_sd1
from invokeai.backend.cache.estimate import AttentionCall, CallFacts, ConfigLike, Estimator, WorkingMemory

ESTIMATORS: dict[tuple[str, str], Estimator] = {**estimators_sd1.ESTIMATORS, **estimators_krea2.ESTIMATORS}

# Estimator components that are one operation of a model component rather than the component itself.
_MODEL_COMPONENT = {"vae_decode": "vae", "vae_encode": "vae"}

__all__ = [
    "ESTIMATORS",
    "AttentionCall",
    "CallFacts",
    "WorkingMemory",
    "estimate_working_memory",
    "model_component",
]


def model_component(component: str) -> str:
    """The model component (as `invokeai.backend.models` names it) an estimator component runs: vae_decode -> vae."""
    return _MODEL_COMPONENT.get(component, component)


def estimate_working_memory(family: str, component: str, config: ConfigLike, facts: CallFacts) -> WorkingMemory:
    try:
        estimator = ESTIMATORS[(family, component)]
    except KeyError:
        known = ", ".join(f"{f}/{c}" for f, c in sorted(ESTIMATORS))
        raise KeyError(f"no working-memory estimator for {family}/{component}; known: {known}") from None
    return estimator(config, facts)

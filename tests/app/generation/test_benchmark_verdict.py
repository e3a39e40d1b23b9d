"""benchmarks/generation.py judges its ratio by a bootstrap interval over rounds: "within" or "over" the target only
when the whole interval is on one side of it. Its fixed-cost item is a batch the server takes."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture(scope="module")
def bench(monkeypatch_module: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch_module.syspath_prepend(str(BENCHMARKS))  # the script imports its sibling _server
    spec = importlib.util.spec_from_file_location("generation_benchmark", BENCHMARKS / "generation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch_module.setitem(sys.modules, spec.name, module)  # its dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _rounds(centre: float, round_spread: float, pair_spread: float, count: int = 8) -> list[list[float]]:
    draw = random.Random(7)
    return [
        [centre + shift + draw.gauss(0, pair_spread) for _ in range(6)]
        for shift in (draw.gauss(0, round_spread) for _ in range(count))
    ]


def test_the_interval_holds_the_judged_ratio_and_narrows_with_more_rounds(bench: ModuleType) -> None:
    few, many = _rounds(1.0, 0.05, 0.05, count=4), _rounds(1.0, 0.05, 0.05, count=32)
    for rounds in (few, many):
        low, high = bench.ratio_interval(rounds)
        assert low < bench.pooled_ratio(rounds) < high
    assert bench.ratio_interval(many)[1] - bench.ratio_interval(many)[0] < (
        bench.ratio_interval(few)[1] - bench.ratio_interval(few)[0]
    )


def test_the_rounds_are_the_draws_a_shifted_round_widens_the_interval(bench: ModuleType) -> None:
    # Same pairs, but in the second case one round's processes shifted all its pairs: pooled as independent pairs
    # the interval would hardly move; drawn by round it widens.
    steady = _rounds(1.0, 0.0, 0.02)
    shifted = [ratios[:] for ratios in steady]
    shifted[0] = [ratio + 0.15 for ratio in shifted[0]]
    steady_width = bench.ratio_interval(steady)[1] - bench.ratio_interval(steady)[0]
    shifted_width = bench.ratio_interval(shifted)[1] - bench.ratio_interval(shifted)[0]
    assert shifted_width > 1.5 * steady_width


@pytest.mark.parametrize(("centre", "expected"), [(0.95, "within"), (1.15, "over"), (1.05, "too close")])
def test_the_verdict_says_within_or_over_only_when_the_interval_is_on_one_side(
    bench: ModuleType, centre: float, expected: str
) -> None:
    low, high = bench.ratio_interval(_rounds(centre, 0.01, 0.02))
    assert bench.verdict(low, high).startswith(expected)


def test_the_fixed_cost_item_is_a_batch_the_server_accepts(bench: ModuleType) -> None:
    from invokeai.app.services.queue_models import EnqueueBatchBody

    body = EnqueueBatchBody.model_validate(bench.FIXED_COST_BODY)
    [node] = body.batch.graph.nodes.values()
    assert node.type == "blank_image"


def test_every_measured_graph_runs_uncached(bench: ModuleType) -> None:
    # The same graph is enqueued round after round: cached, its nodes would not run and the ratio would time lookups.
    assert bench.CASES
    for case in bench.CASES:
        nodes = case.body["batch"]["graph"]["nodes"].values()
        assert [node.get("use_cache") for node in nodes] == [False] * len(nodes), case.label

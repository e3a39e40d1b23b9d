"""Graph validation cost against graph size: is it linear in nodes plus edges?

For 1k, 4k, 16k and 64k `image_resize` nodes, two graphs: a chain (valid: it is accepted) and the same chain
closed into a cycle (refused). Each is parsed from JSON as the API parses a body, then timed through what the
server does with the enqueued batch below the API: `expand_batch`, which validates the graph (its edges, inputs,
and execution order or the cycle). The node-count limit (max_graph_nodes) is the API's and is passed as None
here, so that 64k still reaches the code it measures.

Each figure is the best of a few runs, in CPU seconds of this process (other processes on the machine do not
count), after a garbage collection (so that the collector's pass over the parsed body, or over an earlier run's
leftovers, is not billed to validation). The ratio of each size to 1k is printed; linear means 64k costs at most
80 times 1k (64 times, with room for caches: past about 16k nodes pydantic-core's string cache no longer makes an
edge's node id the same object as the node's key, so each lookup compares strings). Parsing the body is printed
for reference and not judged. The last line is PASS or FAIL; the exit status is 0 for PASS.

    python benchmarks/graph_validation.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from typing import Any

from invokeai.app.services.batch import InvalidBatchError, expand_batch
from invokeai.app.services.queue_models import EnqueueBatchBody

SIZES = (1_000, 4_000, 16_000, 64_000)
MAX_RATIO = 80.0


def batch_body(nodes: int, cycle: bool) -> str:
    """A batch whose graph is a chain of image_resize nodes (the first one given its image), or a cycle."""
    graph_nodes: dict[str, dict[str, Any]] = {
        f"n{i}": {"id": f"n{i}", "type": "image_resize", "width": 8, "height": 8} for i in range(nodes)
    }
    links = nodes if cycle else nodes - 1
    edges = [
        {
            "source": {"node_id": f"n{i}", "field": "image"},
            "destination": {"node_id": f"n{(i + 1) % nodes}", "field": "image"},
        }
        for i in range(links)
    ]
    batch: dict[str, Any] = {"graph": {"id": "g", "nodes": graph_nodes, "edges": edges}, "runs": 1}
    if not cycle:
        graph_nodes["n0"]["image"] = {"image_name": "start.png"}
    return json.dumps({"batch": batch})


def expand(body: EnqueueBatchBody) -> str:
    try:
        sessions = expand_batch(body.batch)
    except InvalidBatchError as error:
        return "refused" if "cycle" in error.message else f"refused?! {error.message[:80]}"
    return f"{len(sessions)} sessions"


def measure(nodes: int, cycle: bool, repeat: int) -> tuple[float, float, str]:
    """Best parse time and best validation time, in seconds, and what validation answered."""
    raw = batch_body(nodes, cycle)
    parse_times, validate_times, answer = [], [], ""
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        body = EnqueueBatchBody.model_validate_json(raw)
        parse_times.append(time.process_time() - start)
        # The parse's objects, collected now: otherwise the collector's full pass over them lands in validation.
        gc.collect()
        start = time.process_time()
        answer = expand(body)
        validate_times.append(time.process_time() - start)
        del body
    return min(parse_times), min(validate_times), answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs per size; the best counts (default 5)")
    args = parser.parse_args()
    worst = 0.0
    for cycle in (False, True):
        shape = "cycle" if cycle else "chain"
        base = 0.0
        for nodes in SIZES:
            parse_s, validate_s, answer = measure(nodes, cycle, args.repeat)
            base = base or validate_s
            ratio = validate_s / base
            if nodes == SIZES[-1]:
                worst = max(worst, ratio)
            print(
                f"{shape:28} {nodes:>6} nodes: validate {validate_s * 1000:8.1f} ms  ratio to 1k {ratio:6.1f}  "
                f"({answer}; parse {parse_s * 1000:.1f} ms, not judged)",
                flush=True,
            )
    verdict = "PASS" if worst <= MAX_RATIO else "FAIL"
    print(f"64k / 1k: worst ratio {worst:.1f} (linear: at most {MAX_RATIO:.0f})")
    print(verdict)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

"""A trainer's CPU per published version, with the delta back-off and without it.

A delta over half the full size is refused and the version published whole; after a
refusal the publisher skips encoding the next 1, 2, 4, up to ``MAX_DELTA_SKIP``
versions. The baseline, measured in the same run, tries a delta every version
(``MAX_DELTA_SKIP = 0``, the behaviour before the back-off).

Each case trains ``--versions`` real steps of the hf backend (one torch thread, the
default job's batch shape: 32 x 8, short prompts and completions) and publishes each
version to a local store; the figure is the publish's process CPU time, mean over the
versions, and which versions went as deltas. Cases: the tiny model at the default rate
(3e-4: most bf16 weights move each step) and at 1e-6 (few move: every delta is worth
it), and a 4-layer, 256-wide model at the default rate; a new batch every step. Where
the updates turn sparse part way, the back-off's cost is the versions it publishes whole
before it tries again. Also the mean over the versions published whole alone. Prints
the figures and writes ``bench/results/publish.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _machine import at_least_one, cpu_model, write_results
from shared_prefix import grouped

RESULTS = Path(__file__).parent / "results" / "publish.json"


def publish_run(model_dir: str, lr: float, versions: int, skip: int,
                store_dir: Path) -> dict:
    import torch
    from astraflow_trainer_hf import HFConfig
    from astraflow_trainer_hf.backend import HFTrainerBackend
    from omegaconf import OmegaConf

    from astraflow.testing.trainer import with_behaviour_logprobs
    from astraflow.types import Batch
    from astraflow.weights import publisher as pub
    from astraflow.weights.safetensors_io import from_torch
    from astraflow.weights.store import WeightStore

    pub.MAX_DELTA_SKIP = skip
    torch.set_num_threads(1)
    torch.manual_seed(0)
    backend = HFTrainerBackend(OmegaConf.merge(OmegaConf.structured(HFConfig()),
                                               {"lr": lr}), model_dir)
    publisher = pub.WeightPublisher(WeightStore(store_dir), "p")
    seconds, kinds = [], []
    for version in range(versions):
        items = grouped(40, 32, 8, (4, 6), (1, 5), seed=version)  # a new batch each step
        backend.train_step(with_behaviour_logprobs(
            backend, Batch(batch_id=f"b{version}", policy="p", items=items)))
        weights = {n: from_torch(t) for n, t in backend.export_weights().items()}
        start = time.process_time()
        manifest = publisher.publish(version, weights)
        seconds.append(time.process_time() - start)
        kinds.append("d" if any(f.startswith("delta") for f in manifest["files"]) else "f")
    whole = [t for t, kind in zip(seconds[1:], kinds[1:], strict=True) if kind == "f"]
    return {"publish_cpu_ms": 1000 * statistics.mean(seconds[1:]),
            "whole_publish_cpu_ms": 1000 * statistics.mean(whole) if whole else None,
            "deltas_tried": publisher.deltas_tried, "published": "".join(kinds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--versions", type=at_least_one, default=40)
    args = parser.parse_args()

    from astraflow.config import ModelConfig
    from astraflow.models.tiny import make_tiny_model
    from astraflow.weights import codec
    from astraflow.weights.publisher import MAX_DELTA_SKIP

    codec.warm()  # neither side pays the kernels' compilation
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_tiny_model(Path(tmp) / "tiny", ModelConfig(warmstart_steps=0), seed=0)
        wide = make_tiny_model(Path(tmp) / "wide", ModelConfig(
            hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
            warmstart_steps=0), seed=0)
        cases = [("tiny model, lr 3e-4", tiny, 3e-4), ("tiny model, lr 1e-6", tiny, 1e-6),
                 ("4 x 256 model, lr 3e-4", wide, 3e-4)]
        for n, (name, model, lr) in enumerate(cases):
            runs = {key: publish_run(model, lr, args.versions, skip,
                                     Path(tmp) / f"store-{n}-{key}")
                    for key, skip in (("every version", 0), ("back-off", MAX_DELTA_SKIP))}
            base, new = runs["every version"], runs["back-off"]
            rows.append({"case": name, **{f"{k.replace(' ', '_')}_{m}": v
                                          for k, r in runs.items() for m, v in r.items()},
                         "cpu_ratio": new["publish_cpu_ms"] / base["publish_cpu_ms"]})
            whole = (f"; versions published whole {base['whole_publish_cpu_ms']:.2f} -> "
                     f"{new['whole_publish_cpu_ms']:.2f} ms" if base["whole_publish_cpu_ms"]
                     and new["whole_publish_cpu_ms"] else "")
            print(f"{name}: {base['publish_cpu_ms']:.2f} -> {new['publish_cpu_ms']:.2f} ms "
                  f"({rows[-1]['cpu_ratio']:.2f}x){whole}, deltas tried {base['deltas_tried']} -> "
                  f"{new['deltas_tried']}\n  every version: {base['published']}\n"
                  f"  back-off:      {new['published']}", flush=True)
    cpu = cpu_model()
    print(f"CPU: {cpu} (one torch thread; d: a delta, f: whole)")
    write_results(RESULTS, {"cpu": cpu, "versions": args.versions, "cases": rows})


if __name__ == "__main__":
    main()

"""Turn GSM8K files you already have into AstraFlow task rows (JSON Lines).

Input: the dataset's own files, read locally -- the Hugging Face release's parquet
shards (``main/train-00000-of-00001.parquet``, ``main/test-00000-of-00001.parquet``) or
the original ``train.jsonl``/``test.jsonl``; both have ``question`` and ``answer``
(worked solution ending in ``#### <number>``). Output, one row per problem::

    {"prompt": [{"role": "user", "content": "<question> Let's think step by step and
      output the final answer after \\"####\\"."}],
     "answer": "<number>", "solution": "<worked solution>", "index": 0}

which ``task=jsonl`` reads as it is (``prompt`` is a chat conversation, rendered with the
checkpoint's chat template on each rollout node; ``answer`` goes to the reward).

    python examples/gsm8k/prepare_gsm8k.py --train PATH --test PATH --out data/gsm8k
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def rows(path: Path) -> Iterator[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path, columns=["question", "answer"]).to_pylist()
    else:
        with path.open(encoding="utf-8") as fh:
            yield from (json.loads(line) for line in fh if line.strip())


def convert(src: Path, dst: Path) -> int:
    dst.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with dst.open("w", encoding="utf-8") as out:
        for index, row in enumerate(rows(src)):
            solution = row["answer"]
            final = solution.rsplit("####", 1)[-1].strip().replace(",", "")
            out.write(json.dumps({
                "prompt": [{"role": "user", "content": f"{row['question']} {INSTRUCTION}"}],
                "answer": final, "solution": solution, "index": index,
            }) + "\n")
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, required=True, help="GSM8K train file")
    parser.add_argument("--test", type=Path, required=True, help="GSM8K test file")
    parser.add_argument("--out", type=Path, default=Path("data/gsm8k"))
    args = parser.parse_args()
    for split, src in (("train", args.train), ("test", args.test)):
        n = convert(src, args.out / f"{split}.jsonl")
        print(f"{split}: {n} rows -> {args.out / f'{split}.jsonl'}")


if __name__ == "__main__":
    main()

"""``astraflow tinker``: serve the Tinker API over one base model, for the unchanged SDK.

    astraflow tinker --model DIR [--name meta-llama/Llama-3.2-1B] --state runs/tinker \\
        [--keys keys.txt] [--host 127.0.0.1] [--port 8000]

Clients point the SDK at it: ``TINKER_BASE_URL=http://127.0.0.1:8000`` and
``TINKER_API_KEY=<one of the keys>`` (the SDK wants keys that start with ``tml-``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

log = logging.getLogger("astraflow.tinker")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="astraflow tinker", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   help="the base model: a Hugging Face checkpoint directory")
    p.add_argument("--name", default=None,
                   help="the name clients ask for (base_model); default: the directory's name")
    p.add_argument("--state", required=True,
                   help="where the ledger and every saved state live (kept across restarts)")
    p.add_argument("--keys", default=None,
                   help="a file of API keys, one a line (each its own owner); default: "
                        "$TINKER_API_KEY")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the frozen base weights' dtype (auto: bfloat16 on a GPU, float32 "
                        "on the CPU); adapters and optimizer state are float32")
    p.add_argument("--max-body-mb", type=int, default=64)
    p.add_argument("--poll-seconds", type=float, default=20.0,
                   help="how long a retrieve_future waits before answering try_again")
    return p


def read_keys(path: str | None) -> list[str]:
    """The accepted keys; a set-up mistake is one line naming what and where."""
    if path is None:
        key = os.environ.get("TINKER_API_KEY", "").strip()
        if not key:
            raise SystemExit("astraflow tinker: no API key: pass --keys FILE or set "
                             "TINKER_API_KEY")
        keys = [key]
        where = "$TINKER_API_KEY"
    else:
        file = Path(path)
        if not file.is_file():
            raise SystemExit(f"astraflow tinker: --keys {path}: no such file")
        lines = [ln.strip() for ln in file.read_text().splitlines()]
        keys = [ln for ln in lines if ln and not ln.startswith("#")]
        where = path
        if not keys:
            raise SystemExit(f"astraflow tinker: --keys {path}: no keys in the file")
    for key in keys:
        if not key.startswith("tml-") or len(key) < 8:
            raise SystemExit(f"astraflow tinker: {where}: a key must start with 'tml-' (the "
                             "tinker SDK refuses others) and be at least 8 characters")
    return keys


def _check_model(path: str) -> Path:
    model = Path(path).expanduser().resolve()
    if not (model / "config.json").is_file():
        raise SystemExit(f"astraflow tinker: --model {path}: not a Hugging Face checkpoint "
                         "directory (no config.json)")
    return model


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    keys = read_keys(args.keys)
    model_dir = _check_model(args.model)
    state = Path(args.state).expanduser().resolve()
    state.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        raise SystemExit(f"astraflow tinker: cannot listen on {args.host}:{args.port}: "
                         f"{exc.strerror}") from None
    asyncio.run(_serve(args, keys, model_dir, state, sock))
    return 0


async def _serve(args: argparse.Namespace, keys: list[str], model_dir: Path, state: Path,
                 sock: socket.socket) -> None:
    import uvicorn

    from astraflow_tinker.engine import Engine
    from astraflow_tinker.server import build_app
    from astraflow_tinker.service import Service
    from astraflow_tinker.worker import Worker

    name = args.name or model_dir.name
    print(f"astraflow tinker: loading {name} from {model_dir}", file=sys.stderr, flush=True)
    engine = await asyncio.to_thread(Engine, model_dir, dtype=args.dtype)
    worker = Worker(asyncio.get_running_loop())
    service = Service(engine, name, model_dir, state, worker)
    app = build_app(service, keys, max_body_bytes=args.max_body_mb << 20,
                    poll_seconds=args.poll_seconds)
    host, port = sock.getsockname()[:2]
    url = f"http://{host}:{port}"
    (state / "url").write_text(url + "\n")
    print(f"astraflow tinker: serving {name} at {url} (TINKER_BASE_URL); state in {state}",
          file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        worker.stop()
        service.ledger.close()

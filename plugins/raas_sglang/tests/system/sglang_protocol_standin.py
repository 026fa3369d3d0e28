"""PROTOCOL STAND-IN for an SGLang server, for CPU protocol tests only -- not SGLang.

SGLang does not install on CPU machines, so the backend's protocol tests run against
this server: it takes ``sglang.launch_server``'s flags (unknown flags are errors) and
serves the routes, field names and answer shapes of SGLang's native API
(``/health``, ``/get_model_info``, ``/generate``, ``/pause_generation``,
``/continue_generation``, ``/update_weights_from_disk``, and with ``--enable-lora``
``/load_lora_adapter``, ``/unload_lora_adapter`` and ``/generate``'s ``lora_path``) with a
real tiny torch model (its adapters through ``peft``).
Like SGLang it rejects unknown sampling keys and invalid sampling values, answers ``n > 1``
with a list, reports ``(logprob, token_id, text)`` triples computed on
temperature-scaled logits, and holds new requests while generation is paused.

Routes under ``/standin/`` exist only here: a log of the weight-control calls and
faults to inject (bad answers, a crash mid-request), so tests can watch the client.

Run: ``python -m sglang_protocol_standin --model-path DIR --port N --skip-tokenizer-init``
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

SAMPLING_KEYS = {  # SGLang's SamplingParams API fields
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
    "logit_bias", "sampling_seed",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang_protocol_standin")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-lora-rank", type=int)
    p.add_argument("--max-loras-per-batch", type=int, default=8)
    p.add_argument("--max-loaded-loras", type=int)
    p.add_argument("--lora-target-modules", nargs="+")
    args = p.parse_args(argv)
    if not args.skip_tokenizer_init:
        p.error("this protocol stand-in implements the --skip-tokenizer-init mode only")
    if not os.path.isdir(args.model_path):
        p.error(f"--model-path {args.model_path} is not a directory")
    return args


class SamplingError(ValueError):
    pass


def sampling_params(raw: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise SamplingError(f"Unexpected keyword argument {unknown[0]!r}")
    sp = {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "n": 1,
          "ignore_eos": False, "stop_token_ids": None, "sampling_seed": None, **raw}
    if not math.isfinite(sp["temperature"]) or sp["temperature"] < 0:
        raise SamplingError(f"temperature must be a non-negative finite number, got "
                            f"{sp['temperature']}.")
    if not 0.0 < sp["top_p"] <= 1.0:
        raise SamplingError(f"top_p must be in (0, 1], got {sp['top_p']}.")
    if sp["max_new_tokens"] < 0:
        raise SamplingError(f"max_new_tokens must be at least 0, got {sp['max_new_tokens']}.")
    if sp["temperature"] < 1e-6:  # SGLang: greedy is top_k=1 at temperature 1
        sp["temperature"], sp["top_k"] = 1.0, 1
    return sp


class Engine:
    """One tiny HF causal LM; generation runs on a single worker thread."""

    def __init__(self, model_path: str, version: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, local_files_only=True).eval()
        self.version = version
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.abort_epoch = 0
        self.adapters: set[str] = set()

    def load_lora(self, name: str, path: str) -> None:
        from peft import PeftModel

        if name in self.adapters:
            raise ValueError(f"The LoRA adapter {name!r} is already loaded")
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        self.model.eval()
        self.adapters.add(name)

    def unload_lora(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        self.model.delete_adapter(name)
        self.adapters.discard(name)

    def generate(self, ids: list[int], sp: dict[str, Any],
                 lora: str | None = None) -> list[dict[str, Any]]:
        import contextlib

        if lora is not None:
            self.model.set_adapter(lora)
            return self._generate(ids, sp)
        off = self.model.disable_adapter() if self.adapters else contextlib.nullcontext()
        with off:
            return self._generate(ids, sp)

    def _generate(self, ids: list[int], sp: dict[str, Any]) -> list[dict[str, Any]]:
        torch = self.torch
        n, epoch = sp["n"], self.abort_epoch
        gen = torch.Generator()
        gen.manual_seed(sp["sampling_seed"] if sp["sampling_seed"] is not None
                        else int.from_bytes(os.urandom(4), "little"))
        stops = set(sp["stop_token_ids"] or [])
        if not sp["ignore_eos"] and self.model.config.eos_token_id is not None:
            stops.add(self.model.config.eos_token_id)
        rows: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        reasons: list[dict[str, Any] | None] = [None] * n
        with torch.inference_mode():
            out = self.model(torch.tensor([ids] * n), use_cache=True)
            for _ in range(sp["max_new_tokens"]):
                logprobs = torch.log_softmax(out.logits[:, -1].float() / sp["temperature"], -1)
                probs = self._filtered(logprobs.exp(), sp)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
                for r in range(n):
                    if reasons[r] is None:
                        tok = int(nxt[r])
                        rows[r].append((float(logprobs[r, tok]), tok))
                        if tok in stops:
                            reasons[r] = {"type": "stop", "matched": tok}
                if self.abort_epoch != epoch:
                    reasons = [r or {"type": "abort", "message": "Abort by pause_generation"}
                               for r in reasons]
                if all(reasons):
                    break
                out = self.model(nxt[:, None], past_key_values=out.past_key_values,
                                 use_cache=True)
        results = []
        for r in range(n):
            reason = reasons[r] or {"type": "length", "length": sp["max_new_tokens"]}
            results.append({
                "output_ids": [t for _, t in rows[r]],
                "meta_info": {
                    "id": uuid.uuid4().hex, "finish_reason": reason,
                    "prompt_tokens": len(ids), "weight_version": self.version,
                    "completion_tokens": len(rows[r]), "cached_tokens": 0,
                    "input_token_logprobs": [],
                    "output_token_logprobs": [[lp, t, None] for lp, t in rows[r]],
                },
            })
        return results

    def _filtered(self, probs, sp):
        torch = self.torch
        if sp["top_k"] > 0:
            kth = torch.topk(probs, min(sp["top_k"], probs.shape[-1]), -1).values[:, -1:]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if sp["top_p"] < 1.0:
            sorted_p, idx = probs.sort(-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > sp["top_p"]
            probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        return probs

    def load(self, model_path: str) -> None:
        from safetensors.torch import load_file

        files = glob.glob(os.path.join(model_path, "*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors in {model_path}")
        state: dict[str, Any] = {}
        for file in files:
            state.update(load_file(file))
        self.model.load_state_dict(state, strict=True)


def build_app(engine: Engine, lora: bool = False) -> FastAPI:
    app = FastAPI()
    running = asyncio.Event()  # cleared while generation is paused
    running.set()
    calls: list[dict[str, Any]] = []
    faults: list[str] = []

    def error(message: str, status: int = 400) -> Response:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": "", "is_generation": True, "weight_version": engine.version}

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await request.json()
        fault = faults.pop(0) if faults else None
        if fault == "crash":
            os._exit(1)
        if fault == "http_500":
            return PlainTextResponse("Internal Server Error", status_code=500)
        if fault == "not_json":
            return PlainTextResponse("<html>bad gateway</html>", status_code=200)
        ids = body.get("input_ids")
        if not ids or not all(isinstance(t, int) for t in ids):
            return error("input_ids must be a non-empty list of token ids")
        try:
            sp = sampling_params(body.get("sampling_params") or {})
        except (SamplingError, TypeError) as exc:
            return error(str(exc))
        adapter = body.get("lora_path")
        if adapter is not None and not lora:
            return error("LoRA is not enabled: start the server with --enable-lora")
        if adapter is not None and adapter not in engine.adapters:
            return error(f"LoRA adapter {adapter!r} is not loaded")
        await running.wait()  # SGLang holds new requests while paused
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(engine.executor, engine.generate, ids, sp, adapter)
        if not body.get("return_logprob"):
            for res in results:
                del res["meta_info"]["output_token_logprobs"]
        if fault == "no_meta_info":
            del results[0]["meta_info"]
        elif fault == "logprob_count":
            results[0]["meta_info"]["output_token_logprobs"].pop()
        elif fault == "token_mismatch":
            results[0]["meta_info"]["output_token_logprobs"][0][1] += 1
        elif fault == "short_batch":
            results.pop()
        return JSONResponse(results if len(results) > 1 else results[0])

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> Response:
        body = await request.json()
        calls.append({"route": "/pause_generation", "body": body})
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return error(f"Invalid mode: {mode!r}.")
        running.clear()
        if mode == "abort":
            engine.abort_epoch += 1
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(request: Request) -> Response:
        calls.append({"route": "/continue_generation", "body": await request.json()})
        running.set()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Response:
        body = await request.json()
        calls.append({"route": "/update_weights_from_disk", "body": body,
                      "paused": not running.is_set()})
        if "model_path" not in body:
            return error("model_path is required")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(engine.executor, engine.load, body["model_path"])
        except (ValueError, RuntimeError, OSError) as exc:
            return JSONResponse({"success": False, "message": f"Failed to update weights: "
                                   f"{exc}", "num_paused_requests": 0}, status_code=400)
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            engine.version = body["weight_version"]
            message += f" Weight version updated to {engine.version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await request.json()
        calls.append({"route": "/load_lora_adapter", "body": body,
                      "paused": not running.is_set()})
        if not lora:
            return error("LoRA is not enabled: start the server with --enable-lora")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(engine.executor, engine.load_lora, body["lora_name"],
                                       body["lora_path"])
        except (ValueError, OSError, KeyError) as exc:
            return JSONResponse({"success": False, "error_message": str(exc),
                                 "loaded_adapters": sorted(engine.adapters)})
        return JSONResponse({"success": True, "error_message": "",
                             "loaded_adapters": sorted(engine.adapters)})

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await request.json()
        calls.append({"route": "/unload_lora_adapter", "body": body})
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(engine.executor, engine.unload_lora, body["lora_name"])
        except (ValueError, KeyError) as exc:
            return JSONResponse({"success": False, "error_message": str(exc),
                                 "loaded_adapters": sorted(engine.adapters)})
        return JSONResponse({"success": True, "error_message": "",
                             "loaded_adapters": sorted(engine.adapters)})

    @app.get("/standin/calls")
    async def get_calls() -> list[dict[str, Any]]:
        return calls

    @app.post("/standin/fault")
    async def add_fault(request: Request) -> dict[str, Any]:
        faults.append((await request.json())["kind"])
        return {"pending": faults}

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import uvicorn

    started = time.time()
    engine = Engine(args.model_path, args.weight_version)
    print(f"protocol stand-in: model loaded in {time.time() - started:.1f} s", flush=True)
    uvicorn.run(build_app(engine, lora=args.enable_lora), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()

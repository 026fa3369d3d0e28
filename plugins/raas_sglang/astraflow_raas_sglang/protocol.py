"""SGLang's native HTTP API as this backend speaks it (``/generate`` and the weight routes).

Field names follow SGLang's ``GenerateReqInput``, ``SamplingParams`` and
``UpdateWeightFromDiskReqInput``. SGLang rejects unknown sampling keys, so only keys
it declares are sent, and optional ones only when set.
"""

from __future__ import annotations

from typing import Any

import httpx

from astraflow.types import Generation, GenerationRequest
from astraflow_raas_sglang.errors import SGLangServerError


def generate_payload(request: GenerationRequest, rid: str,
                     lora_name: str | None = None) -> dict[str, Any]:
    """Token in: the prompt as ids, one request for all ``n`` samples (shared prefix).

    ``ignore_eos`` makes the requested stop ids the only stop condition, as with every
    other backend; workflows pass the end-of-sequence id themselves. ``lora_name``
    names a loaded adapter (SGLang's ``lora_path`` takes a name or a path).
    """
    sampling: dict[str, Any] = {
        "max_new_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "n": request.n,
        "ignore_eos": True,
    }
    if request.stop_token_ids:
        sampling["stop_token_ids"] = list(request.stop_token_ids)
    if request.seed is not None:
        sampling["sampling_seed"] = request.seed
    payload = {
        "input_ids": list(request.prompt_ids),
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "rid": rid,
        "stream": False,
    }
    if lora_name is not None:
        payload["lora_path"] = lora_name
    return payload


def lora_server_args(max_rank: int, adapters: int) -> list[str]:
    """``launch_server`` flags for adapters loaded later: every policy's in one batch,
    and room for each one's next version while the previous is unloaded."""
    return ["--enable-lora", "--max-lora-rank", str(max_rank),
            "--max-loras-per-batch", str(adapters), "--max-loaded-loras", str(2 * adapters),
            "--lora-target-modules", "all"]


def weights_payload(path: str, version: int) -> dict[str, Any]:
    return {
        "model_path": path,
        "weight_version": str(version),
        "flush_cache": True,
        "abort_all_requests": False,
    }


def error_message(resp: httpx.Response) -> str:
    """SGLang's message from an error body (``{"error": {"message"}}``, ``{"message"}``)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])
    return str(body)[:500]


def json_body(resp: httpx.Response, route: str) -> Any:
    """The JSON of a successful answer, or a ``SGLangServerError`` that says what came."""
    if resp.status_code >= 400:
        raise SGLangServerError(
            f"SGLang {route} answered HTTP {resp.status_code}: {error_message(resp)}"
        )
    try:
        return resp.json()
    except ValueError:
        raise SGLangServerError(
            f"SGLang {route} answered HTTP {resp.status_code} with a body that is not JSON: "
            f"{resp.text[:200]!r}"
        ) from None


def parse_generations(body: Any, n: int, fallback_version: int) -> list[Generation]:
    """Token out: one ``Generation`` per sample from a ``/generate`` answer.

    SGLang answers a single prompt with ``n == 1`` as one object and with ``n > 1`` as a
    list of ``n`` objects, each ``{"output_ids", "meta_info"}``.
    """
    items = body if isinstance(body, list) else [body]
    if len(items) != n:
        raise SGLangServerError(f"SGLang /generate returned {len(items)} samples, asked for {n}")
    return [_generation(item, i, fallback_version) for i, item in enumerate(items)]


def _generation(item: Any, index: int, fallback_version: int) -> Generation:
    where = f"SGLang /generate sample {index}"
    if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
        raise SGLangServerError(f"{where} has no meta_info: {str(item)[:200]}")
    meta = item["meta_info"]
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort":
        message = finish.get("message", "") if isinstance(finish, dict) else ""
        raise SGLangServerError(f"{where} was aborted by the server: {message}")
    if kind not in ("stop", "length"):
        raise SGLangServerError(f"{where} has an unknown finish_reason {finish!r}")
    ids = item.get("output_ids")
    triples = meta.get("output_token_logprobs")
    if not isinstance(ids, list) or not isinstance(triples, list):
        raise SGLangServerError(
            f"{where} lacks output_ids or meta_info.output_token_logprobs "
            "(was return_logprob honoured?)"
        )
    if len(triples) != len(ids):
        raise SGLangServerError(
            f"{where} has {len(ids)} output_ids but {len(triples)} output_token_logprobs"
        )
    logprobs = []
    for pos, (tok, triple) in enumerate(zip(ids, triples, strict=True)):
        try:
            logprob, token_id = float(triple[0]), int(triple[1])
        except (TypeError, ValueError, IndexError):
            raise SGLangServerError(
                f"{where}: output_token_logprobs[{pos}] is {triple!r}, "
                "not (logprob, token_id, text)"
            ) from None
        if token_id != tok:
            raise SGLangServerError(
                f"{where}: log-prob {pos} is for token {token_id}, output_ids has {tok}"
            )
        logprobs.append(logprob)
    return Generation([int(t) for t in ids], logprobs, kind, _version(meta, fallback_version))


def _version(meta: dict[str, Any], fallback: int) -> int:
    """The weight version the server says produced the tokens, when it is ours (an int)."""
    try:
        version: Any = meta.get("weight_version")  # None (a TypeError) when it says none
        return int(version)
    except (TypeError, ValueError):
        return fallback

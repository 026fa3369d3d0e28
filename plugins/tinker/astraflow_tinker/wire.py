"""The Tinker wire format: the SDK's protobuf messages to and from plain Python and numpy.

``forward_backward`` arrives as a ``ForwardBackwardRequest`` and its result and a
sample's go back as ``ForwardBackwardOutput`` and ``SampleResponse`` (the SDK refuses
JSON for those two); everything else is JSON. The message classes are the SDK's own
(``tinker.proto``), so the server cannot drift from the client it serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

#: the SDK's tensor dtypes, and what each decodes to
_DTYPES: dict[int, Any] = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64,
                           pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A message that does not decode, or decodes to something no model can take: the
    client's mistake (a 400 naming what and where)."""


@dataclass
class ForwardBackward:
    """A decoded ``forward_backward`` / ``forward`` request."""

    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    #: each datum's tokens (its text chunks joined) and loss inputs by name
    data: list[tuple[list[int], dict[str, np.ndarray]]] = field(default_factory=list)


def decode_forward_backward(body: bytes) -> ForwardBackward:
    """A ``ForwardBackwardRequest`` body, checked: text chunks only, every loss input a
    1-D tensor as long as its datum's tokens."""
    request = pb.ForwardBackwardRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest "
                        f"({exc})") from None
    config = {k: float(v) for k, v in request.loss_fn_config.items()}
    for key, value in request.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "number":
            config[key] = float(value.number)
        elif value.WhichOneof("value") == "text":
            raise WireError(f"forward_backward: loss_fn_config[{key!r}] is text "
                            f"({value.text!r}); the served losses take numbers")
    out = ForwardBackward(request.model_id, int(request.seq_id), request.loss_fn, config,
                          bool(request.forward_only))
    for i, datum in enumerate(request.data):
        tokens = model_input(datum.model_input, f"datum {i}")
        inputs = {}
        for name, tensor in datum.loss_fn_inputs.items():
            array = decode_tensor(tensor, f"datum {i}: loss_fn_inputs[{name!r}]")
            if array.ndim != 1 or array.shape[0] != len(tokens):
                raise WireError(f"datum {i}: loss_fn_inputs[{name!r}] has shape "
                                f"{list(array.shape)}; the model input is {len(tokens)} "
                                f"tokens, so it must be [{len(tokens)}]")
            inputs[name] = array
        out.data.append((tokens, inputs))
    return out


def model_input(chunks: Any, where: str) -> list[int]:
    """The tokens of a datum's chunks, in order (text chunks only)."""
    tokens: list[int] = []
    for chunk in chunks:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"{where}: a {kind} chunk; this server takes text chunks only")
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype="<i4").tolist()
    if not tokens:
        raise WireError(f"{where}: the model input is empty")
    return tokens


def decode_tensor(tensor: Any, where: str) -> np.ndarray:
    """A ``Tensor``: dense little-endian bytes or CSR, in its declared shape."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(f"{where}: dtype {pb.DType.Name(tensor.dtype)} is not served "
                        "(float32, int64, int32)")
    shape = [int(s) for s in tensor.shape]
    try:
        if tensor.WhichOneof("encoding") == "sparse_csr":
            return _csr(tensor.sparse_csr, np.dtype(dtype).newbyteorder("<"), shape)
        flat = np.frombuffer(tensor.dense, dtype=np.dtype(dtype).newbyteorder("<"))
        return flat.reshape(shape if shape else [flat.shape[0]]).astype(dtype)
    except ValueError as exc:
        raise WireError(f"{where}: the data does not fit shape {shape} ({exc})") from None


def _csr(csr: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    values = np.frombuffer(csr.values, dtype=dtype)
    crow = np.frombuffer(csr.crow_indices, dtype="<i8")
    cols = np.frombuffer(csr.col_indices, dtype="<i8")
    if len(shape) != 2 or len(crow) != shape[0] + 1 or len(cols) != len(values):
        raise ValueError("the CSR indices do not match the shape")
    dense = np.zeros(shape, dtype=dtype.newbyteorder("="))
    for row in range(shape[0]):
        dense[row, cols[crow[row]:crow[row + 1]]] = values[crow[row]:crow[row + 1]]
    return dense


def encode_forward_backward(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: each datum's learner ``logprobs`` (float32, one a
    token) in one batched record, and the metrics (``name:reduction`` keys)."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(logprobs))
    parts = [np.ascontiguousarray(lp, dtype="<f4").tobytes() for lp in logprobs]
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype("<i8")
    record.fields["logprobs"].CopyFrom(pb.BatchedTensor(
        data=b"".join(parts), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    out.loss_fn_outputs.append(record)
    for key, value in metrics.items():
        out.metrics[key] = float(value)
    return out.SerializeToString()


def encode_sample(samples: list[Any], prompt_logprobs: list[float | None] | None) -> bytes:
    """A ``SampleResponse``: each sequence's tokens and their log-probabilities, and the
    prompt's (NaN where there is none: its first token)."""
    out = pb.SampleResponse()
    for sample in samples:
        out.sequences.append(pb.SampledSequence(
            stop_reason=pb.STOP_REASON_STOP if sample.stop_reason == "stop"
            else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sample.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(sample.logprobs, dtype="<f4").tobytes()))
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        out.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    return out.SerializeToString()


def json_tokens(prompt: Any) -> list[int]:
    """The tokens of a JSON ``ModelInput`` (``{"chunks": [...]}``), text chunks only."""
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks"), list):
        raise WireError("prompt: expected {'chunks': [...]}")
    tokens: list[int] = []
    for i, chunk in enumerate(prompt["chunks"]):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            kind = chunk.get("type") if isinstance(chunk, dict) else type(chunk).__name__
            raise WireError(f"prompt.chunks[{i}]: a {kind} chunk; this server takes text "
                            "chunks only")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise WireError(f"prompt.chunks[{i}].tokens: expected a list of token ids")
        tokens += ids
    if not tokens:
        raise WireError("prompt: empty")
    return tokens

"""Nodes long-poll for new weight versions: a committed version wakes them at once, and
a node that hears nothing costs one open request per wait instead of a poll loop."""

from __future__ import annotations

import threading
import time

import numpy as np
from dataflow_helpers import TOKEN

from astraflow.weights import safetensors_io as st
from astraflow.weights.client import HttpPublishTarget
from astraflow.weights.publisher import WeightPublisher


def publish(url: str, version: int) -> None:
    """A trainer's publication: upload over HTTP, then commit (which announces it)."""
    model = {"w": st.bf16_from_float32(np.random.default_rng(version).normal(size=(8, 8)))}
    target = HttpPublishTarget(url, TOKEN)
    try:
        WeightPublisher(target, "policy").publish(version, model)
    finally:
        target.close()


def pending(call) -> tuple[threading.Thread, list[dict[str, int]]]:
    """``call()`` running in a thread, and the list its answer will be appended to."""
    answers: list[dict[str, int]] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    return thread, answers


def test_a_waiting_node_hears_of_a_committed_version_at_once(start_server, connect):
    server = start_server()
    node = connect(server)
    waiter, heard = pending(lambda: node.wait_versions({"policy": 0}, wait=120))
    publish(server.url, 1)
    # woken by the commit, long before its 120 s wait ends
    waiter.join(timeout=60)
    assert heard == [{"policy": 1}], "the long-poll was not woken by the commit"
    # a node already behind is answered without waiting
    behind, told = pending(lambda: node.wait_versions({"policy": 0}, wait=120))
    behind.join(timeout=60)
    assert told == [{"policy": 1}]


def test_a_node_that_is_current_waits_the_full_time_and_is_told_nothing_new(start_server,
                                                                            connect):
    server = start_server()
    node = connect(server)
    publish(server.url, 3)
    started = time.monotonic()
    assert node.wait_versions({"policy": 3}, wait=0.5) == {"policy": 3}
    assert time.monotonic() - started >= 0.5

"""A trainer's publish rides through a data layer that is away longer than its retries."""

from __future__ import annotations

import threading
import time

from weights_helpers import TOKEN, _free_port, make_model, serving

from astraflow.testing import wait_until
from astraflow.weights.client import HttpPublishTarget
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.store import WeightStore


def test_a_publish_rides_through_a_data_layer_away_for_longer_than_its_retries(tmp_path):
    """A trainer's publish retries by time, as its data client does: a data layer that
    restarts slowly (no listener for 4 s, past five retries' 3.1 s of backoff) costs the
    trainer a wait, not its life."""
    port = _free_port()
    target = HttpPublishTarget(f"http://127.0.0.1:{port}", TOKEN)  # as a trainer makes it
    failed: list[BaseException] = []

    def publish() -> None:
        try:
            WeightPublisher(target, "p").publish(1, make_model())
        except BaseException as exc:
            failed.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    # the outage: nothing listens on the port for 4 s, or until the publish gave up
    wait_until(lambda: failed or time.monotonic() - started > 4.0, 10, "the outage")
    assert not failed, failed
    with serving(WeightStore(tmp_path / "store"), port) as server:
        thread.join(timeout=60)
        assert not thread.is_alive() and not failed, failed
        assert server.published == [("p", 1)] and server.store.latest("p") == 1
    target.close()

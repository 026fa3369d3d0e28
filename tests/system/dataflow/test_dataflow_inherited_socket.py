"""``astraflow dataflow --fd``: the data layer serves a listening socket its parent bound.

The launcher binds the socket first, so it knows the URL before the data layer has
started and starts the components beside it; a request that comes before the data
layer listens, or while a restarted one starts, waits on the socket and is served,
where a closed port would refuse it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from dataflow_helpers import TOKEN, wait_until

from astraflow.dataflow import listen
from astraflow.dataflow.client import DataflowClient


def _spawn(fd: int, store: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "astraflow", "dataflow", "--fd", str(fd), "--host", "127.0.0.1",
         "--store", str(store)],
        env={**os.environ, "ASTRAFLOW_TOKEN": TOKEN}, pass_fds=(fd,),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_requests_made_before_the_data_layer_listens_are_served_at_the_bound_url(tmp_path):
    sock = listen.bind("127.0.0.1", 0)
    url = listen.url("127.0.0.1", sock)
    store = tmp_path / "store"
    # no retries: a refused connection would fail the request at once
    client = DataflowClient(url, TOKEN, timeout=60.0, retry_for=0.0)
    procs = [_spawn(sock.fileno(), store)]
    try:
        assert not (store / "url").exists()  # asked before the data layer is up
        assert client.status()["nodes"] == []
        wait_until(lambda: (store / "url").exists(), 30, "the data layer's url")
        assert (store / "url").read_text().strip() == url

        procs[0].kill()
        procs[0].wait(timeout=30)
        # asked while no data layer runs: the request waits for the next one
        answer: dict = {}
        asking = threading.Thread(target=lambda: answer.update(client.status()))
        asking.start()
        (store / "url").unlink()
        procs.append(_spawn(sock.fileno(), store))
        asking.join(timeout=60)
        assert not asking.is_alive() and answer["nodes"] == []
        wait_until(lambda: (store / "url").exists(), 30, "the restarted data layer's url")
        assert (store / "url").read_text().strip() == url
    finally:
        client.close()
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)
        sock.close()

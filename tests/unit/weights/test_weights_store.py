"""The store keeps versions monotonic, plans cheap pulls, and never strands the newest."""

from __future__ import annotations

import shutil

import pytest
from weights_helpers import make_model, same, step

from astraflow.weights.errors import VersionError
from astraflow.weights.publisher import WeightPublisher
from astraflow.weights.store import MODEL_FILE, WeightStore, delta_name


def publish_chain(store, n, full_every=3):
    publisher = WeightPublisher(store, "solver", full_every=full_every)
    models = [make_model()]
    publisher.publish(0, models[0])
    for v in range(1, n):
        models.append(step(models[-1], seed=v))
        publisher.publish(v, models[-1])
    return models


def test_versions_rebuild_bit_exactly_and_only_grow(tmp_path):
    store = WeightStore(tmp_path, keep_fulls=None)
    models = publish_chain(store, 5)
    assert store.latest("solver") == 4
    for v, model in enumerate(models):
        assert same(store.load("solver", v), model)
    with pytest.raises(VersionError, match="not newer"):
        store.publish("solver", 4, models[-1])
    assert store.latest("other") is None


def test_plan_follows_deltas_and_falls_back_to_full(tmp_path):
    store = WeightStore(tmp_path, keep_fulls=None)
    publish_chain(store, 5, full_every=100)
    plan = store.plan("solver", 1)
    assert [(f.version, f.base) for f in plan] == [(2, 1), (3, 2), (4, 3)]
    assert [f.name for f in store.plan("solver", None)] == [MODEL_FILE, *[delta_name(v)
                                                                          for v in range(4)]]
    # a version published without a delta breaks every chain through it
    store.publish("solver", 5, step(store.load("solver", 4), seed=9), full=True)
    assert [(f.version, f.base) for f in store.plan("solver", 1)] == [(5, None)]


def test_plan_prefers_full_when_deltas_cost_more(tmp_path):
    store = WeightStore(tmp_path, keep_fulls=None)
    store.publish("p", 0, make_model(0))
    store.publish("p", 1, make_model(1), full=False, delta_base=0)
    store.publish("p", 2, step(make_model(1), seed=2), full=True, delta_base=1)
    files = store.manifest("p", 2)["files"]
    chain = store.manifest("p", 1)["files"][delta_name(0)]["bytes"] + files[delta_name(1)]["bytes"]
    assert chain > files[MODEL_FILE]["bytes"]
    assert [(f.version, f.name) for f in store.plan("p", 0)] == [(2, MODEL_FILE)]
    assert [(f.version, f.name) for f in store.plan("p", 1)] == [(2, delta_name(1))]


def test_retention_keeps_a_path_to_the_newest(tmp_path):
    store = WeightStore(tmp_path, keep_fulls=2)
    models = publish_chain(store, 10, full_every=3)
    fulls = [v for v in store.versions("solver")
             if MODEL_FILE in store.manifest("solver", v)["files"]]
    assert len(fulls) == 2 and store.versions("solver")[0] == fulls[0]
    assert same(store.load("solver"), models[-1])
    # a node far behind still catches up, through a retained full snapshot
    assert store.plan("solver", 0)[0].name == MODEL_FILE


def test_unfinished_versions_stay_invisible(tmp_path):
    store = WeightStore(tmp_path)
    store.publish("p", 1, make_model())
    staging = store.staging("p")
    shutil.copy(store.version_dir("p", 1) / MODEL_FILE, staging / MODEL_FILE)
    assert store.versions("p") == [1]
    with pytest.raises(VersionError, match="only deltas"):
        store.publish("p", 3, make_model(), full=False, delta_base=2, base=make_model())


def test_publisher_sends_full_when_delta_is_not_worth_it(tmp_path):
    store = WeightStore(tmp_path, keep_fulls=None)
    publisher = WeightPublisher(store, "p", full_every=100)
    base = make_model()
    assert set(publisher.publish(0, base)["files"]) == {MODEL_FILE}
    assert set(publisher.publish(1, step(base, 1))["files"]) == {delta_name(0)}
    assert set(publisher.publish(2, make_model(seed=7))["files"]) == {MODEL_FILE}



def test_a_stream_of_dense_steps_is_not_encoded_as_deltas_every_version(tmp_path):
    """Refused deltas back off (1, 2, 4, 8 versions published whole without trying);
    once the steps turn sparse, deltas are back within MAX_DELTA_SKIP versions and every
    version still loads bit for bit."""
    from astraflow.weights.publisher import MAX_DELTA_SKIP

    store = WeightStore(tmp_path, keep_fulls=None)
    publisher = WeightPublisher(store, "p", full_every=1000)
    models = [make_model()]
    publisher.publish(0, models[0])
    for v in range(1, 20):  # every weight moves: no delta is worth it
        models.append(make_model(seed=v))
        assert set(publisher.publish(v, models[-1])["files"]) == {MODEL_FILE}
    assert publisher.deltas_tried == 4  # versions 1, 3, 6 and 11
    deltas = []
    for v in range(20, 20 + MAX_DELTA_SKIP + 3):  # sparse steps from here
        models.append(step(models[-1], seed=v))
        deltas.append(delta_name(v - 1) in publisher.publish(v, models[-1])["files"])
    first = deltas.index(True)
    assert first <= MAX_DELTA_SKIP and all(deltas[first:])
    for v, model in enumerate(models):
        assert same(store.load("p", v), model)

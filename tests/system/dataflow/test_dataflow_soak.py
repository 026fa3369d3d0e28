"""A compressed soak (``bench/soak.py``): the data layer under steady two-policy load for
45 s, remembering done work for 4 s, must stay flat -- resident memory, the store, its
CPU per trajectory, and lease and submit latency -- once warm. The bench runs the same
for an hour."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"

pytestmark = pytest.mark.timeout(240)


def test_the_data_layer_stays_flat_under_steady_load(monkeypatch):
    # importable by name: its node processes are spawned and import it again
    monkeypatch.syspath_prepend(str(BENCH))
    soak = importlib.import_module("soak")
    # the first and last thirds after the warm-up compared (the bench: tenths of an hour)
    result = soak.soak(seconds=45, rate=1500, retain=4, warmup=15, sample=1, clients=1,
                       slots=8, tokens=64, window=1 / 3)
    checks = result["checks"]
    print({k: result[k] for k in ("p50", "p99", "cpu_ms_per_trajectory")})
    assert result["achieved_over_target"] >= 0.6, result["achieved_trajectories_per_s"]
    # everything accepted is trained but the last batches in flight
    assert result["trained"] >= result["accepted"] - 4 * soak.BATCH
    assert checks["rss_growth_ok"], checks
    # the store: the bench's 1.2x is for a quiet machine; here the rate the neighbours
    # leave moves how much retention holds (a CI run grew it past 1.2x with every other
    # check passing), while keeping every task done would grow it 2.5x (45 s of tasks
    # against the 18 s at its first reading)
    assert checks["database_growth"] <= 1.0, checks
    assert checks["payload_log_max_mb"] <= 2 * soak.SEGMENT_BYTES / 2**20, checks
    # retention keeps what is remembered to a few seconds' worth of tasks
    remembered = [s["remembered"] for s in result["samples"] if s["t"] >= 15]
    assert max(remembered) < 2 * result["achieved_trajectories_per_s"] * 4 / 8 + 200
    # the slope, as work: the data layer's CPU per trajectory accepted (a scan of every
    # task remembered per request would grow it several times). The neighbours' load
    # hardly moves it (two busy loops on both cores through the last third: 0.199 ->
    # 0.182 ms), where it moves latency (the same: median x2.3, p99 x2.7; a CI run's
    # p99 30 -> 123 ms): latency's bound here is on the median, and only against growth
    # past what sharing two cores explains
    assert checks["cpu_per_trajectory_last_over_first"] <= 1.5, result["cpu_ms_per_trajectory"]
    for kind in ("lease", "submit"):
        assert checks[f"{kind}_p50_last_over_first"] <= 3.0, result["p50"]

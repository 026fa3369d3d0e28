"""data=replay is installed and passes the shared batch-sampler contract, with each of
its selection rules."""

from astraflow.testing import assert_plugin_installed
from astraflow.testing.contracts import BatchSamplerContract


class TestReplayContract(BatchSamplerContract):
    option = "replay"


class TestReplayLatestContract(BatchSamplerContract):
    option = "replay"
    settings = {"selection": "latest", "replay_ratio": 0.5, "max_staleness": 1}


class TestReplayByRewardContract(BatchSamplerContract):
    option = "replay"
    settings = {"selection": "reward", "replay_ratio": 0.75}


def test_plugin_is_installed():
    assert_plugin_installed("data_replay", "astraflow-plugin-data-replay", "data", "replay")

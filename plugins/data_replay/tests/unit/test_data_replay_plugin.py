from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed("data_replay", "astraflow-plugin-data-replay", "data", "replay")

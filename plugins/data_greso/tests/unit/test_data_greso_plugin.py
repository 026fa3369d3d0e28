from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed("data_greso", "astraflow-plugin-data-greso", "data", "greso")

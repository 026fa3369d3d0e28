from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed("raas_sglang", "astraflow-plugin-raas-sglang", "raas", "sglang")

from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed("trainer_hf", "astraflow-plugin-trainer-hf", "trainer", "hf")

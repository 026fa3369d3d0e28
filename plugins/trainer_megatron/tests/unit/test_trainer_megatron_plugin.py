from astraflow.testing import assert_plugin_installed


def test_plugin_is_installed():
    assert_plugin_installed(
        "trainer_megatron", "astraflow-plugin-trainer-megatron", "trainer", "megatron"
    )

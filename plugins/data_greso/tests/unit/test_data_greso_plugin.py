"""data=greso is installed and passes the shared task-selector contract."""

from astraflow.testing import assert_plugin_installed
from astraflow.testing.contracts import TaskSelectorContract


class TestGresoContract(TaskSelectorContract):
    option = "greso"


class TestGresoOfOnePolicyContract(TaskSelectorContract):
    """Heeding one policy's groups only (the contract reports two policies')."""

    option = "greso"
    settings = {"policy": "policy", "p_init": 0.2}


def test_plugin_is_installed():
    assert_plugin_installed("data_greso", "astraflow-plugin-data-greso", "data", "greso")

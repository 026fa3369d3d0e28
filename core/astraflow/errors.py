"""Errors that tell the user what to do next."""


class AstraFlowError(Exception):
    """Base class of AstraFlow's user-facing errors."""


class UnknownOptionError(AstraFlowError, KeyError):
    """An option was selected that no installed plugin provides."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNameError(AstraFlowError):
    """Two plugins registered the same name for the same kind."""


class NotAvailableYetError(AstraFlowError):
    """A plugin is installed but the selected implementation does not exist yet."""


class PluginLoadError(AstraFlowError):
    """A plugin failed to import or to register."""


class ConfigError(AstraFlowError):
    """The composed config is not valid."""

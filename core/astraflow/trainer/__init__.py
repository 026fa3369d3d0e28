"""trainer."""

import os


def distributed() -> bool:
    """Whether this process is one rank of several (started by ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1

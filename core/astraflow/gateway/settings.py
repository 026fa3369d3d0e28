"""A node's gateway: where it listens and what a request gets when it names nothing.

``workflow=agent``'s section (:class:`astraflow.workflows.agent.AgentConfig`) takes these
fields with their defaults and ranges (:func:`astraflow.schema.like`), and the gateway
is built from that section: each default is written here alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from astraflow.gateway.tools import PARSERS
from astraflow.schema import setting


@dataclass
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = setting(0, ge=0, le=65535)  # 0 picks a free port
    #: the host agents are told to use (another machine's sandbox: this node's address)
    advertise_host: str | None = None
    max_body_bytes: int = setting(8 * 1024 * 1024, ge=1)
    max_tokens: int = setting(16, ge=1)  # when a request names none
    #: a request's max_tokens above it is lowered to it (Claude Code asks 128k a reply,
    #: and a rollout's length is the run's to choose); null: the context length alone
    max_tokens_cap: int | None = setting(None, ge=1)
    temperature: float = setting(1.0, ge=0)  # when a request names none
    tool_parser: str = setting("auto", choices=PARSERS)
    max_n: int = setting(16, ge=1)

    @classmethod
    def of(cls, section: Any) -> GatewaySettings:
        """The settings a section with the gateway's fields (the agent's) gives."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)
                      if hasattr(section, f.name)})


#: the gateway's fields by name, for a section that takes them (:func:`~astraflow.schema.like`)
FIELDS = {f.name: f for f in dataclasses.fields(GatewaySettings)}

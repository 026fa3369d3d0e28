"""Reward options (``reward=exact_match|math|regex|python``) and the runner that calls
them on nodes. Every option is registered through the ``astraflow_register_rewards``
hook like any plugin's."""

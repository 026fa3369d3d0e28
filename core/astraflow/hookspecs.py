"""The plugin contract of AstraFlow: one registration hook per contract.

Every hook receives a ``register`` callback (the style of ``llm.register_models``)::

    register(name, factory, config_cls=None, *, description="", check=None)

* ``name`` -- the option users select, e.g. ``raas=vllm``. Names are unique per kind;
  a second registration of the same name is rejected naming both providers.
* ``factory`` -- the implementation, either a ``"module:attr"`` string imported only
  when the option is selected (so registering never imports torch, vLLM, ...) or a
  callable. Calling it with the option's config returns an instance of the contract's
  ABC from :mod:`astraflow.contracts`.
* ``config_cls`` -- a dataclass with the option's settings. It becomes the Hydra
  structured config of the option: installing the plugin makes ``+group=name``
  selectable with no edit to ``conf/``, and unknown keys are errors.
* ``check`` -- optional, a ``"module:function"`` string (or the function) that raises
  ``ValueError`` on a config the option cannot run, without importing the
  implementation. The launcher calls it before anything starts; without it, it imports
  the factory to call its ``check_config`` (an engine import: seconds of start-up). A
  check with a ``model_path`` parameter also gets the run's checkpoint directory, to
  refuse a layout it cannot run (``trainer=megatron`` a mixture-of-experts model).

Built-in implementations are registered through these same hooks by
:mod:`astraflow.builtins`.
"""

from collections.abc import Callable

import pluggy

#: the callback each hook is given: ``register(name, factory, config_cls=None, *,
#: description="", check=None)``
Register = Callable[..., None]

hookspec = pluggy.HookspecMarker("astraflow")
hookimpl = pluggy.HookimplMarker("astraflow")


@hookspec
def astraflow_register_rollout_backends(register: Register) -> None:
    """Register rollout backends (config group ``raas``).

    A rollout backend wraps one inference engine for a RaaS node: start it, generate
    token ids with per-token behaviour log-probs, load a new weight version, pause and
    resume, shut down. Contract: :class:`astraflow.contracts.RolloutBackend`.
    """


@hookspec
def astraflow_register_trainer_backends(register: Register) -> None:
    """Register trainer backends (config group ``trainer``).

    A trainer backend owns one policy's model and optimiser: train step, per-token
    log-probs, export of weights by Hugging Face tensor names, checkpoints.
    Contract: :class:`astraflow.contracts.TrainerBackend`.
    """


@hookspec
def astraflow_register_task_selectors(register: Register) -> None:
    """Register data algorithms for the before-rollout point (config group ``data``).

    A task selector decides which tasks are issued to rollout nodes (GRESO,
    curricula). Contract: :class:`astraflow.contracts.TaskSelector`.
    """


@hookspec
def astraflow_register_trajectory_filters(register: Register) -> None:
    """Register data algorithms for the after-rollout point (config group ``data``).

    A trajectory filter sees each completed group and keeps or drops it (dynamic
    sampling). Contract: :class:`astraflow.contracts.TrajectoryFilter`.
    """


@hookspec
def astraflow_register_batch_samplers(register: Register) -> None:
    """Register data algorithms for the batch-serving point (config group ``data``).

    A batch sampler composes the batch a trainer receives (replay, mixing,
    staleness correction). Contract: :class:`astraflow.contracts.BatchSampler`.
    """


@hookspec
def astraflow_register_workflows(register: Register) -> None:
    """Register agentic workflows (config group ``workflow``).

    A workflow turns one task into trajectories using named policy handles,
    possibly over many turns with tools. Contract: :class:`astraflow.contracts.Workflow`.
    """


@hookspec
def astraflow_register_tasks(register: Register) -> None:
    """Register task sources (config group ``task``).

    A task source yields training tasks and a held-out evaluation split.
    Contract: :class:`astraflow.contracts.TaskSource`.
    """


@hookspec
def astraflow_register_rewards(register: Register) -> None:
    """Register reward functions (config group ``reward``).

    A reward scores a completion against a task (float, or a dict with a ``score`` and
    extra metrics; plain or async). Contract: :class:`astraflow.contracts.Reward`;
    ``config_cls`` should extend :class:`astraflow.rewards.base.RewardConfig` so that
    ``reward.timeout`` and ``reward.max_failure_fraction`` apply to it.
    """


@hookspec
def astraflow_register_loggers(register: Register) -> None:
    """Register metric loggers (config group ``logger``; several may be selected:
    ``logger=[tensorboard,wandb]``).

    A logger receives a run's metric records while it runs and sends them where users
    look (TensorBoard files, Weights & Biases, MLflow, ...).
    Contract: :class:`astraflow.contracts.MetricLogger`.
    """


@hookspec
def astraflow_register_advantage_estimators(register: Register) -> None:
    """Register advantage estimators (no config group: each policy selects one with
    ``policies.<name>.advantage=NAME``; the default is ``grpo``).

    An advantage estimator turns the rewards of a group into one advantage per sample at
    intake and may normalise a served batch's advantages (REINFORCE++). The factory is
    called with an instance of ``config_cls`` at its defaults, or None.
    Contract: :class:`astraflow.contracts.AdvantageEstimator`.
    """

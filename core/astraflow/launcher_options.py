"""The launchers' settings (``launcher=local``, ``launcher=ray``), typed like every other
group: a mistyped key (``launcher.max_restartz=5``, with or without ``+``) or a value of
the wrong type or range (``launcher.preload=flase``) stops the run before it starts.

Torch- and Ray-free: the config is composed and checked before either is imported.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from astraflow.schema import check, setting


@dataclass
class LocalLauncherConfig:
    """``launcher=local``: every component a local subprocess of ``python -m astraflow``."""

    kind: str = setting("local", choices=("local",))
    #: a live progress table on the console
    progress: bool = True
    #: restarts allowed per component (data layer, trainer, evaluator, node) within
    #: restart_window seconds before the run fails: a component crashing in a loop stops
    #: the run, one killed now and then over days of running does not
    max_restarts: int = setting(3, ge=0)
    restart_window: float = setting(600.0, gt=0)
    #: throughput fraction of local node i, cycled: [1.0, 0.6, 0.3] models three pools
    #: on one CPU
    node_throttle: list[float] = setting(default_factory=lambda: [1.0], gt=0, le=1)
    #: with autoscale=true: seconds between reads of /v1/autoscale, and the least time
    #: between two changes of the pool (the report's window lags behind a change)
    autoscale_interval: float = setting(2.0, gt=0)
    autoscale_cooldown: float = setting(20.0, ge=0)
    #: fork every Python component from one parent that imported torch, transformers and
    #: the selected plugins once (false: each component starts fresh and imports them)
    preload: bool = True
    #: more modules for that parent to import (an agent framework, vllm); one that starts
    #: a thread makes forking unsafe, and components then start fresh
    preload_modules: list[str] = field(default_factory=list)
    #: estimate the run's peak memory before anything starts (astraflow.launch.memory:
    #: the checkpoint's safetensors headers, the trainer's settings, the components
    #: started) and refuse, in one line, a run that cannot fit in this machine's memory
    #: or its cgroup's limit; false starts it anyway
    memory_check: bool = True


@dataclass
class PlacementConfig:
    """What one component asks Ray for; ``resources`` pin it to the machines that have
    them (``{region_eu: 1}``)."""

    num_cpus: float = setting(0.0, ge=0)
    num_gpus: float = setting(0.0, ge=0)
    #: ``{name: amount}``; checked by :meth:`RayLauncherConfig.relations` (untyped: a map
    #: given whole on the command line replaces it, which a typed map would refuse)
    resources: Any = None


@dataclass
class PoolConfig(PlacementConfig):
    """A rollout pool: ``nodes`` RaaS nodes, each placed as the other settings say."""

    nodes: int = setting(1, ge=0)
    num_cpus: float = setting(1.0, ge=0)


@dataclass
class RayLauncherConfig:
    """``launcher=ray``: every component a Ray actor's process, placed by its resources."""

    kind: str = setting("ray", choices=("ray",))
    progress: bool = True
    #: a running cluster: auto, ray://HOST:10001 or HOST:PORT; null starts one on this
    #: machine
    address: str | None = None
    #: custom resources of the cluster started when address is null
    local_resources: Any = None
    #: where components keep their files on the machines they run on (the data layer's
    #: store, the trainer's checkpoints, downloaded weights), one directory per run under
    #: it; null: the machine's temp dir. Point it at storage that outlives a machine to
    #: keep the checkpoints of a trainer Ray restarts elsewhere. The run directory is the
    #: driver's: logs, metrics and final weights are copied into it over Ray.
    work_dir: str | None = None
    #: after a run that ended well its working directories are removed (a failed run
    #: keeps them); true keeps them
    keep_work_dir: bool = False
    #: Ray restarts a component that crashed after it got to work, this many times
    max_restarts: int = setting(3, ge=0)
    #: rollout pools: name -> {nodes, num_cpus, num_gpus, resources} (:class:`PoolConfig`,
    #: checked by :meth:`relations`: a pool map given whole on the command line replaces
    #: this one, which a typed map would refuse). null: one pool "default" of num_nodes
    #: nodes of one CPU each
    pools: Any = None
    trainer: PlacementConfig = field(default_factory=lambda: PlacementConfig(num_cpus=1.0))
    evaluator: PlacementConfig = field(default_factory=PlacementConfig)
    #: the data layer keeps its store on the machine it is placed on: pin it with a
    #: resource when the cluster has several
    dataflow: PlacementConfig = field(default_factory=PlacementConfig)
    #: seconds the data layer may take to be placed and listen
    start_timeout: float = setting(300.0, gt=0)
    #: with no launcher.address (a cluster of this machine), the local launcher's check
    #: of the run's peak memory against this machine's (a cluster's machines are not
    #: known before Ray places the components: not checked)
    memory_check: bool = True
    autoscale_interval: float = setting(2.0, gt=0)
    autoscale_cooldown: float = setting(20.0, ge=0)

    @staticmethod
    def relations(launcher: Any) -> list[str]:
        """Each pool of ``pools`` against :class:`PoolConfig`."""
        out = [problem for key in ("local_resources", "trainer.resources",
                                   "evaluator.resources", "dataflow.resources")
               if (problem := _resources_problem(f"launcher.{key}",
                                                 OmegaConf.select(launcher, key)))]
        pools = launcher.get("pools")
        if pools is None:
            return out
        if not isinstance(pools, DictConfig):
            return [*out, f"launcher.pools={pools}: a map of pool name to its settings "
                    f"({', '.join(f.name for f in dataclasses.fields(PoolConfig))})"]
        for name, pool in pools.items():
            where = f"launcher.pools.{name!s}"
            if not isinstance(pool, DictConfig):
                out.append(f"{where}={pool}: a pool is a map of its settings")
                continue
            names = sorted(f.name for f in dataclasses.fields(PoolConfig))
            unknown, problems = check(pool, PoolConfig, f"{where}.")
            for key in unknown:
                near = difflib.get_close_matches(key.rpartition(".")[2], names, n=1)
                out.append(f"{key} is not a setting; a pool has: {', '.join(names)}"
                           + (f" (did you mean {near[0]}?)" if near else ""))
            out += problems
            if problem := _resources_problem(f"{where}.resources", pool.get("resources")):
                out.append(problem)
        return out


def _resources_problem(key: str, value: Any) -> str | None:
    """A Ray resources map is ``{name: amount >= 0}`` (or unset)."""
    if value is None:
        return None
    if not isinstance(value, DictConfig) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for v in value.values()):
        return f"{key}={value}: a map of resource name to an amount >= 0, e.g. {{region_eu: 1}}"
    return None


#: ``launcher=NAME`` -> its settings
LAUNCHERS: dict[str, type] = {"local": LocalLauncherConfig, "ray": RayLauncherConfig}

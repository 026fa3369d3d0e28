"""Record and replay the experts a ``transformers`` mixture-of-experts model routes to.

A ``transformers`` MoE layer asks its router (a ``...TopKRouter`` module: Qwen2/3-MoE,
Mixtral, OLMoE, ...) for ``(router_logits, scores, indices)`` over the layer's tokens laid
out ``[batch * sequence, ...]``, then sends each token to ``indices`` weighted by
``scores``. Hooks on those routers:

- :class:`Recorder` keeps each call's ``indices`` (the rollout engine);
- :class:`Replay` replaces them by the engine's, where the engine routed the token, and
  recomputes ``scores`` for those experts from the router's own logits the way the
  router does (softmax over all experts, then renormalised over the chosen ones or
  not; or softmax over the chosen logits), so the router's weights still get gradients.
  The recipe is found on the first call by reproducing the router's own scores from its
  own choices; a router none reproduces is refused with its class named.

:class:`Replay` also counts how often the trainer's own router would have chosen other
experts than the engine did (``routing_mismatch``: the fraction of routed (token, layer)
pairs whose expert sets differ) and how often the forward did use others
(``routing_difference``: the same without replay, 0 with it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is the plugins' to import: the core imports without it
    import torch
    from torch import nn


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k routers, in layer order."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def _indices(output: Any) -> torch.Tensor:
    import torch

    if (not isinstance(output, tuple) or len(output) != 3
            or output[2].dtype not in (torch.int64, torch.int32)):
        raise TypeError("router replay expects a router returning (logits, scores, "
                        f"indices), got {type(output).__name__}")
    return output[2]


class Recorder:
    """Keeps the indices every router returned, call by call, while installed."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = routers(model)
        self.calls: list[list[torch.Tensor]] = []  # per forward: per layer [tokens, k]
        self._handles: list[Any] = []

    @property
    def top_k(self) -> int:
        return int(getattr(self.routers[0], "top_k", 0) or 0)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        self.calls = []
        layer_of = {id(r): i for i, r in enumerate(self.routers)}

        import torch

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            layer = layer_of[id(module)]
            if layer == 0:
                self.calls.append([])
            self.calls[-1].append(_indices(output).detach().to("cpu", torch.int64))

        self._handles = [r.register_forward_hook(hook) for r in self.routers]
        try:
            yield self
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def stacked(self, call: int, shape: tuple[int, int]) -> torch.Tensor:
        """Forward ``call``'s choices as ``[batch, sequence, layers, top_k]``."""
        import torch

        layers = self.calls[call]
        return torch.stack(layers, dim=1).reshape(*shape, len(layers), layers[0].shape[-1])


def _recipes(logits: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    """The scores of experts ``chosen`` by each way routers weigh them."""
    import torch

    probs = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
    return {
        "softmax": probs,
        "softmax_normalised": probs / probs.sum(-1, keepdim=True),
        "topk_softmax": torch.softmax(logits.float().gather(-1, chosen), dim=-1),
    }


class Replay:
    """Routes every token the way ``want`` says while installed (see the module)."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = routers(model)
        if not self.routers:
            raise ValueError(f"router replay: {type(model).__name__} has no top-k router "
                             "(a mixture-of-experts layer); it has nothing to replay")
        self._recipe: dict[type, str] = {}
        #: routed (token, layer) pairs seen, those the router's own choice differed on,
        #: and those the forward used other experts for than the engine (0 with replay)
        self.routed = 0
        self.differed = 0
        self.used_otherwise = 0

    def _weigh(self, module: nn.Module, logits: torch.Tensor, own: torch.Tensor,
               scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        import torch

        kind = type(module)
        if kind not in self._recipe:
            with torch.no_grad():
                tolerance = 1e-4 if scores.dtype == torch.float32 else 2e-2
                for name, value in _recipes(logits, own).items():
                    if torch.allclose(value.to(scores.dtype).float(), scores.float(),
                                      atol=tolerance, rtol=tolerance):
                        self._recipe[kind] = name
                        break
                else:
                    raise ValueError(f"router replay: {kind.__name__} weighs its experts in "
                                     "a way replay does not know (not a softmax over its "
                                     "logits, renormalised or not, nor over the chosen ones)")
        return _recipes(logits, chosen)[self._recipe[kind]].to(scores.dtype)

    @contextlib.contextmanager
    def routing(self, want: torch.Tensor | None, replay: bool = True) -> Iterator[Replay]:
        """``want``: ``[batch, sequence, layers, top_k]`` expert indices, -1 where the
        router chooses (None: it chooses everywhere). ``replay=False`` only counts the
        mismatch."""
        if want is None:
            yield self
            return
        layer_of = {id(r): i for i, r in enumerate(self.routers)}
        if want.shape[2] != len(self.routers):
            raise ValueError(f"router replay: the trajectories carry {want.shape[2]} MoE "
                             f"layers' routing, the model has {len(self.routers)}")
        flat = want.reshape(-1, want.shape[2], want.shape[3])
        import torch

        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            logits, scores, own = output
            given = flat[:, layer_of[id(module)]].to(own.device)
            if given.shape != own.shape:
                raise ValueError(f"router replay: {tuple(given.shape)} routed experts for a "
                                 f"router call over {tuple(own.shape)}")
            routed = (given >= 0).all(-1)
            differs = (given.sort(-1).values != own.sort(-1).values).any(-1) & routed
            self.routed += int(routed.sum())
            self.differed += int(differs.sum())
            if not replay:
                self.used_otherwise += int(differs.sum())
                return output
            chosen = torch.where(routed[:, None], given, own)
            return logits, self._weigh(module, logits, own, scores, chosen), chosen

        handles = [r.register_forward_hook(hook) for r in self.routers]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def take(self) -> dict[str, float]:
        """Since the last call, over the (token, layer) pairs the engine routed:
        ``routing_mismatch``, the fraction the trainer's own router chose other experts
        for, and ``routing_difference``, the fraction its forward used other experts for
        (0 with replay). Empty if none were routed."""
        routed, differed, used = self.routed, self.differed, self.used_otherwise
        self.routed = self.differed = self.used_otherwise = 0
        if not routed:
            return {}
        return {"routing_mismatch": differed / routed, "routing_difference": used / routed}

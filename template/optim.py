"""Lookahead (Zhang et al., 2019, arXiv 1907.08610) around any torch optimizer, nameable from YAML: a slow copy of
the weights, updated every k steps, damps the noise of large learning rates."""

from collections.abc import Callable, Iterable

import torch
from torch.optim import Optimizer


class Lookahead(Optimizer):
    """The inner ``optimizer`` takes the fast steps; every ``k`` of them the slow weights move ``alpha`` of the way
    to the fast ones, and the fast weights restart from there. Its ``param_groups`` are the inner optimizer's own, so
    schedules and parameter groups work as without it; its state (the slow weights) is saved beside the inner one's.

    Args:
        params: the parameters or parameter groups, passed to the inner optimizer.
        optimizer: builds the inner optimizer from ``params`` (``class_path`` and ``init_args`` in YAML).
        k: fast steps between two updates of the slow weights.
        alpha: the share of the way the slow weights move to the fast ones at an update.
        alpha_power: ``None``: ``alpha`` at every update (Zhang et al.). A power p: the share ramps from 1 at the
            start to ``alpha`` at the end of ``total_steps``, as ``1 - (1 - alpha) * progress ** p``: little
            averaging while the learning rate is large (airbench's: alpha = 1 - 0.95 ** 5, p = 3).
        total_steps: optimizer steps in the whole run, by default the run's; the last ends on the slow weights.
    """

    def __init__(
        self,
        params: Iterable,
        optimizer: Callable[[Iterable], Optimizer] = torch.optim.SGD,
        k: int = 5,
        alpha: float = 0.5,
        alpha_power: float | None = None,
        total_steps: int | None = None,
    ) -> None:
        if k < 1 or not 0 < alpha <= 1:
            raise ValueError(f"Lookahead k={k} must be at least 1 and alpha={alpha} in (0, 1]")
        if alpha_power is not None and (alpha_power <= 0 or not total_steps):
            raise ValueError(
                f"Lookahead alpha_power={alpha_power} must be positive and needs total_steps (got {total_steps}): "
                "the module passes the run's when it is left out"
            )
        self.optimizer = optimizer(params)
        if isinstance(self.optimizer, Lookahead):
            raise ValueError("Lookahead around a Lookahead: give the inner optimizer a plain torch optimizer")
        super().__init__(self.optimizer.param_groups, self.optimizer.defaults)
        self.param_groups = self.optimizer.param_groups  # one list: a schedule's change reaches the inner optimizer
        self.k, self.alpha, self.alpha_power, self.total_steps = k, alpha, alpha_power, total_steps
        self.steps = 0
        self.buffers: list[torch.Tensor] = []  # follow_buffers: the network's statistics, averaged as the weights
        self.slow_buffers: list[torch.Tensor] = []

    def follow_buffers(self, buffers: Iterable[torch.Tensor]) -> None:
        """Average floating-point ``buffers`` (BatchNorm's statistics) too: the slow weights get their own."""
        self.buffers = [buffer for buffer in buffers if buffer.is_floating_point()]

    def alpha_at(self, step: int) -> float:
        """The share the slow weights move at optimizer step ``step`` (counted from 1)."""
        if self.alpha_power is None:
            return self.alpha
        progress = min(1.0, step / self.total_steps)
        return 1 - (1 - self.alpha) * progress**self.alpha_power

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        parameters = [parameter for group in self.param_groups for parameter in group["params"]]
        for parameter in parameters:  # the slow weights start where the fast ones do, before their first step
            if "slow" not in self.state[parameter]:
                self.state[parameter]["slow"] = parameter.detach().clone()
        if len(self.slow_buffers) != len(self.buffers):
            self.slow_buffers = [buffer.detach().clone() for buffer in self.buffers]
        loss = self.optimizer.step(closure)
        self.steps += 1
        update = self.steps % self.k == 0
        if update or self.steps == self.total_steps:  # the run ends on the slow weights, as Zhang et al. evaluate
            pairs = [(self.state[parameter]["slow"], parameter) for parameter in parameters]
            for slow, fast in pairs + list(zip(self.slow_buffers, self.buffers)):
                if update:
                    slow.lerp_(fast, self.alpha_at(self.steps))
                fast.copy_(slow)
        return loss

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "lookahead": super().state_dict(),
            "steps": self.steps,
            "slow_buffers": self.slow_buffers,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        steps, saved = state_dict.get("steps"), state_dict.get("slow_buffers", [])  # no buffers before a first step
        inner = [state_dict.get(key) for key in ("optimizer", "lookahead")]
        shapes = [b.shape if torch.is_tensor(b) else None for b in saved] if isinstance(saved, list) else None
        own = [b.shape for b in self.buffers]
        if not all(isinstance(x, dict) for x in inner) or not isinstance(steps, int) or shapes not in ([], own):
            raise ValueError(
                "Lookahead: the optimizer state is damaged or from another network: it needs the inner and own "
                f"states (dicts), steps (a count; got {type(steps).__name__}) and slow_buffers (this network's "
                f"{len(own)} averaged buffers; got {type(saved).__name__} {shapes})"
            )
        self.optimizer.load_state_dict(inner[0])
        super().load_state_dict(inner[1])
        self.param_groups = self.optimizer.param_groups  # loading made new group dicts: share the inner's again
        self.steps = steps
        self.slow_buffers = [value.to(buffer.device, buffer.dtype) for value, buffer in zip(saved, self.buffers)]

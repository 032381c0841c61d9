"""The recipe's schedules, the unit a scheduler steps in and its plan held to the run's length, the parameter
groups and the optimizer built from them."""

import functools
import math
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any

from lightning.pytorch.callbacks import StochasticWeightAveraging
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CyclicLR, LRScheduler

from template.compat import batches_done_in_epoch
from template.nets.shape import takes


class Factory(functools.partial):
    """An optimizer's or scheduler's factory, shared by a copy of its module (EMAWeightAveraging's), not copied:
    jsonargparse's hold the whole command line, and under DDP the launcher's processes, which cannot be copied."""

    def __deepcopy__(self, memo: dict) -> "Factory":
        return self


class WarmupCosine(LRScheduler):
    """Linear warmup, then cosine decay, stepped once per optimizer step (or per epoch: ``model.scheduler_interval``).

    Warmup avoids the large, badly aimed updates of the first steps, while BatchNorm statistics and Adam's
    moments are still poor. With ``cycles > 1`` the cosine restarts from the peak (SGDR, Loshchilov & Hutter).

    Args:
        optimizer: its ``lr`` is the peak learning rate.
        total_steps: scheduler steps in the whole run (optimizer steps, or epochs); by default the run's.
        warmup_fraction: share of ``total_steps`` spent warming up linearly.
        min_lr_ratio: floor of the decay, as a fraction of the peak.
        cycles: number of cosine cycles after warmup (1: no restarts).
        warmup_start: the warmup's first factor of the peak (0: from its first step's share).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int | None = None,
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.0,
        cycles: int = 1,
        warmup_start: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if total_steps is None or total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {total_steps}")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if cycles < 1 or not 0.0 <= warmup_start <= 1.0:
            raise ValueError(f"cycles must be at least 1 and warmup_start in [0, 1], got {cycles}, {warmup_start}")
        self.total_steps, self.warmup_fraction = total_steps, warmup_fraction
        self.warmup_steps = round(warmup_fraction * total_steps)
        self.min_lr_ratio, self.cycles, self.warmup_start = min_lr_ratio, cycles, warmup_start
        super().__init__(optimizer, last_epoch)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:  # never 0: the first step is not wasted
            return self.warmup_start + (1 - self.warmup_start) * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * self.decay(progress)

    def decay(self, progress: float) -> float:
        cycle_progress = 1.0 if progress == 1.0 else (progress * self.cycles) % 1.0
        return 0.5 * (1.0 + math.cos(math.pi * cycle_progress))

    def get_lr(self) -> list[float]:
        for group in self.optimizer.param_groups[len(self.base_lrs) :]:  # added later: an unfrozen backbone
            self.base_lrs.append(group.setdefault("initial_lr", group["lr"]))
        return [base_lr * self.lr_factor(self.last_epoch) for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        # A run resumed with another length (epochs, batch size, images...) is re-planned as training starts.
        super().load_state_dict(state_dict)
        self.warmup_steps = round(self.warmup_fraction * self.total_steps)  # derived, never a file's
        self.resumed = True

    def replan(self, total_steps: int, unit: str = "optimizer steps") -> None:
        planned = self.total_steps
        self.total_steps, self.warmup_steps = max(1, total_steps), round(self.warmup_fraction * total_steps)
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr  # the next step already uses the new plan
        message = f"learning-rate schedule re-planned from {planned} to {self.total_steps} {unit}"
        rank_zero_info(f"{message}; continuing from {self.last_epoch}")


class WarmupLinear(WarmupCosine):
    """Linear warmup, then linear decay to ``min_lr_ratio`` of the peak (``cycles`` unused): airbench's triangle."""

    def decay(self, progress: float) -> float:
        return 1.0 - progress


def build_optimizer(
    make: Callable, config: Any, groups: list[dict], total_steps: int | Callable[[], int], buffers: Iterable = ()
) -> Optimizer:
    """The optimizer ``make`` builds for ``groups`` (``total_steps`` as ``build_scheduler`` gives them), their
    ``lr_scale`` and ``weight_decay_scale`` applied; one that averages weights (Lookahead) averages ``buffers`` too."""
    optimizer = build_scheduler(make, config, groups, total_steps)
    if callable(getattr(optimizer, "follow_buffers", None)):
        optimizer.follow_buffers(buffers)
    for group in optimizer.param_groups:
        group["lr"] *= group.pop("lr_scale", 1.0)
        if "weight_decay_scale" in group:
            group["weight_decay"] *= group.pop("weight_decay_scale")
    return optimizer


def build_scheduler(make: Callable, config: Any, optimizer: Optimizer, total_steps: int | Callable[[], int]) -> Any:
    """The scheduler ``make`` builds, given the run's ``total_steps`` (a function, asked only then) where its class
    takes them and its ``config`` (``{"class_path", "init_args"}``, or None for a partial) does not set them."""
    if isinstance(config, dict) and isinstance(config.get("class_path"), str):
        cls, given = pkgutil.resolve_name(config["class_path"]), (config.get("init_args") or {})
    else:
        cls, given = getattr(make, "func", make), getattr(make, "keywords", {})
    if isinstance(cls, type) and takes(cls, "total_steps") and given.get("total_steps") is None:
        length = total_steps() if callable(total_steps) else total_steps
        if not math.isfinite(length):
            raise ValueError(
                f"{cls.__name__} plans over the run's length, and this run has none (trainer.max_epochs -1 and no "
                "trainer.max_steps): set one of them, or its total_steps"
            )
        built = make(optimizer, total_steps=int(length))
        built.planned_over_run = True  # the run's length, not the user's: a resume of another length re-plans it
        return built
    return make(optimizer)


def interval_of(scheduler: Any) -> str:
    """The unit a scheduler's arguments count: ``step`` (``total_steps``, CyclicLR's) or ``epoch`` (StepLR's...)."""
    return "step" if hasattr(scheduler, "total_steps") or isinstance(scheduler, CyclicLR) else "epoch"


# What a scheduler plans, in the unit it steps at: the run's whole length, or steps the run should reach.
PLANNED_LENGTHS, PLANNED_STEPS = ("total_steps", "T_max"), ("step_size", "milestones", "total_iters")


def run_length(trainer: Any, interval: str) -> float:
    """The run's length in the unit a scheduler steps at: its optimizer steps, or the epochs they take (fewer than
    max_epochs where max_steps ends the run first, its last epoch cut short; one where the loader has no length)."""
    steps = trainer.estimated_stepping_batches
    if interval == "step" or not math.isfinite(steps):
        return steps
    return max(1, math.ceil(steps / math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)))


def run_end(trainer: Any) -> float:
    """The optimizer step a resumed run ends at: the steps done, then the epochs left at this run's steps an epoch.
    Lightning's estimate counts every epoch at today's (another batch size: another count), from step 0."""
    estimated = trainer.estimated_stepping_batches
    if trainer.max_epochs in (None, -1) or not math.isfinite(trainer.num_training_batches):
        return estimated
    per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
    ready = batches_done_in_epoch(trainer)  # resumed within an epoch; a window not yet stepped counts none
    done = ready // trainer.accumulate_grad_batches if ready < trainer.num_training_batches else per_epoch
    end = trainer.global_step + max(0, trainer.max_epochs - trainer.current_epoch) * per_epoch - done
    return min(end, trainer.max_steps) if trainer.max_steps != -1 else end


def check_plan(trainer: Any) -> None:
    """Hold each scheduler's plan to the run it steps through, before training: ``total_steps`` short of the run is
    an error (the rest would train at the schedule's floor; OneCycleLR fails there), a plan the run does not play out
    as written a warning (``max_steps`` may stop it early on purpose). A run of no set length goes unchecked, and one
    under StochasticWeightAveraging (its SWALR takes over the schedule; its BatchNorm epoch takes no step) is re-planned
    on resume alone."""
    averaging = any(isinstance(callback, StochasticWeightAveraging) for callback in trainer.callbacks)
    for config in trainer.lr_scheduler_configs:
        resumed = config.scheduler.__dict__.pop("resumed", False)
        step = config.interval == "step"
        unit, ours = "optimizer steps" if step else "epochs", getattr(config.scheduler, "planned_over_run", False)
        if resumed and ours and math.isfinite(steps := run_end(trainer)):
            end = int(steps) if step else int(run_length(trainer, "epoch"))
            if end != config.scheduler.total_steps:  # another length: fit to it
                config.scheduler.replan(end, unit)
                for optimizer in trainer.optimizers:  # Lookahead's ramp and last sync count optimizer steps
                    if getattr(optimizer, "total_steps", None):
                        optimizer.total_steps = int(steps)
            continue
        run = run_length(trainer, config.interval)
        if not 0 < run < math.inf or averaging:
            continue
        run = int(run) // config.frequency
        for name in (*PLANNED_LENGTHS, *PLANNED_STEPS):
            value = getattr(config.scheduler, name, None)
            value = sorted(value) if isinstance(value, Iterable) else value  # MultiStepLR's milestones: a Counter
            planned = max(value, default=0) if isinstance(value, list) else value
            if type(planned) is not int:
                continue
            said = f"model.lr_scheduler.init_args.{name}={value} {unit}, but this run has {run}"
            if name == "total_steps" and planned < run:
                raise ValueError(
                    f"{said}: its last {run - planned} would train at the schedule's end (its floor; OneCycleLR stops "
                    f"with an error there). Leave total_steps out: the schedule then plans over the run's own {run} "
                    "(resumed, a schedule other than warmup-cosine keeps its first plan: keep the run's length)"
                )
            if planned > run or (planned == run and name in PLANNED_STEPS):
                rank_zero_warn(
                    f"{said}: the run ends before the schedule reaches {planned}, so what it plans there never "
                    f"happens (fine if max_steps is to stop a longer plan early; else fit it to the run's {run})"
                )
            elif planned < run and name in PLANNED_LENGTHS:  # T_max: the cosine rises again after its floor
                rank_zero_warn(f"{said}: the schedule reaches its end at {planned}, then climbs; set it to {run}")


def parameter_groups(net: nn.Module, layer_decay: float | None = None) -> list[dict]:
    """The trainable parameters of ``net`` (a network, or a LightningModule: its network's and its own, a learnable
    temperature say) in groups: no weight decay on norm weights and biases (under 2 dimensions: no scale to limit,
    Goyal et al., 2017); per scale of a module's ``lr_scales`` ({name: scale}), a group at that many times the
    learning rate, same decay per step. With ``layer_decay``, timm's groups per depth of the network (``net.net``),
    frozen ones included, and the rest at the full learning rate."""
    outer = layer_groups(getattr(net, "net", net), layer_decay) if layer_decay is not None else []
    grouped = {id(parameter) for group in outer for parameter in group["params"]}
    scales = {id(getattr(m, name)): scale for m in net.modules() for name, scale in getattr(m, "lr_scales", {}).items()}
    decay, no_decay, scaled = [], [], {}
    for parameter in (parameter for parameter in net.parameters() if id(parameter) not in grouped):
        if parameter.requires_grad and id(parameter) in scales:
            scaled.setdefault(float(scales[id(parameter)]), []).append(parameter)
        elif parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
        *(
            {"params": params, "lr_scale": scale, "weight_decay_scale": 1 / scale, "name": f"lr_x{scale:g}"}
            for scale, params in scaled.items()
        ),
    ]
    return outer + [group for group in groups if group["params"]] if outer else groups


def layer_groups(net: nn.Module, layer_decay: float) -> list[dict]:
    from template.nets.timm_models import import_timm

    if not 0 < layer_decay <= 1:
        raise ValueError(f"model.layer_decay={layer_decay} must be in (0, 1]: 0.65 to 0.85 are usual")
    if not hasattr(net, "group_matcher"):
        raise ValueError(
            f"model.layer_decay needs a network that names its layers' depth (a timm network's "
            f"group_matcher); {type(net).__name__} has none: set model.layer_decay to null"
        )
    import_timm()
    from timm.optim import param_groups_layer_decay

    frozen = [parameter for parameter in net.parameters() if not parameter.requires_grad]
    net.requires_grad_(True)  # timm leaves frozen parameters out: kept in, unfreezing needs no new group
    try:
        groups = param_groups_layer_decay(net, weight_decay=1.0, layer_decay=layer_decay)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(False)
    for group in groups:  # named by their distance from the head: lr_scale is layer_decay ** distance
        distance = round(math.log(group["lr_scale"]) / math.log(layer_decay)) if layer_decay < 1 else 0
        group["name"] = f"depth{distance}_{'decay' if group['weight_decay'] else 'no_decay'}"
        if group["weight_decay"]:
            del group["weight_decay"]  # the optimizer's own
    return groups

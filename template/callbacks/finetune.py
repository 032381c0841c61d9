"""Fine-tuning a pretrained network: the new head learns on frozen features first, then all of it, gently."""

import lightning as L
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn
from torch.optim import Optimizer

from template.checkpoints import DamagedCheckpointError
from template.compat import batches_done_in_epoch
from template.module import parameter_groups
from template.nets.pretrained import backbone_of


def settable(key: str, value: object, defaults: dict, group: dict) -> bool:
    """Whether a saved group's ``key`` may hold ``value`` in this run: its rates (the schedule's, checked on resume),
    no weight decay (norms, biases), a momentum a schedule cycles (OneCycleLR's, CyclicLR's), or the optimizer's own
    setting."""
    if key not in defaults or key in ("lr", "initial_lr") or value == defaults[key]:
        return True
    return (key, value) == ("weight_decay", 0.0) or key in ("momentum", "betas") and "max_momentum" in group


class FreezeBackbone(BaseFinetuning):
    """Freeze all but the classifier head (the network's last ``nn.Linear``) until ``unfreeze_at_epoch`` (0: never
    frozen), then train the backbone too at ``backbone_lr_ratio`` times the head's learning rate, in the recipe's
    groups; ``train_bn`` keeps BatchNorm layers training while frozen. A fresh head on frozen features sends no
    large, random gradients into pretrained weights; the lower rate then adapts them without undoing them.
    """

    def __init__(self, unfreeze_at_epoch: int = 1, backbone_lr_ratio: float = 0.1, train_bn: bool = False) -> None:
        super().__init__()
        if unfreeze_at_epoch < 0 or not 0.0 < backbone_lr_ratio <= 1.0:
            raise ValueError(
                f"unfreeze_at_epoch must be >= 0 and backbone_lr_ratio in (0, 1], not {unfreeze_at_epoch} and "
                f"{backbone_lr_ratio}"
            )
        self.unfreeze_at_epoch, self.backbone_lr_ratio, self.train_bn = unfreeze_at_epoch, backbone_lr_ratio, train_bn

    def freeze_before_training(self, pl_module: L.LightningModule) -> None:
        # The network's own fixed parameters (a whitening stem's filters) stay fixed once the backbone unfreezes.
        self.fixed = [parameter for parameter in pl_module.net.parameters() if not parameter.requires_grad]
        if self.unfreeze_at_epoch > 0:
            self.freeze(backbone_of(pl_module.net), train_bn=self.train_bn)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A resume's optimizer groups, which Lightning takes from this callback's state, must hold this run's
        parameters and settings: a file's others (maximize, betas) trained otherwise, past the resume's checks."""
        names, optimizers = dict(pl_module.named_parameters()), trainer.optimizers
        for index, groups in self.state_dict()["internal_optimizer_metadata"].items():
            defaults = optimizers[index].defaults if isinstance(index, int) and 0 <= index < len(optimizers) else {}
            other = [] if defaults else [f"optimizer {index!r}"]
            for group in groups if defaults else ():
                other += [
                    f"{key}={value!r}" for key, value in group.items() if not settable(key, value, defaults, group)
                ]
                other += [f"params {name!r}" for name in group.get("params", []) if name not in names]
            if other:
                raise DamagedCheckpointError(
                    f"refusing {trainer.ckpt_path}: its FreezeBackbone state holds optimizer groups of "
                    f"{', '.join(other[:3])}, which this run's optimizer has not: damaged or made up"
                )
        super().on_fit_start(trainer, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if batches_done_in_epoch(trainer):  # resumed within an epoch, which Lightning does not start again
            self.on_train_epoch_start(trainer, pl_module)

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer: Optimizer) -> None:
        # Every epoch from then on: a run resumed past it is frozen again by setup, its groups restored.
        if epoch < self.unfreeze_at_epoch or self.unfreeze_at_epoch == 0:
            return
        backbone = nn.ModuleList(backbone_of(pl_module.net))
        self.make_trainable(backbone)
        for parameter in self.fixed:
            parameter.requires_grad_(False)
        if {id(p) for p in backbone.parameters()} <= {id(p) for g in optimizer.param_groups for p in g["params"]}:
            return  # already in the optimizer's groups (model.layer_decay's): trainable now, at their own rates
        ratio, head, before = self.backbone_lr_ratio, optimizer.param_groups[0], len(optimizer.param_groups)
        rates = {"lr": head["lr"] * ratio, "initial_lr": head.get("initial_lr", head["lr"]) * ratio}
        # What a schedule keeps in each group (OneCycleLR's max_lr...), and in lists of one per group (base_lrs,
        # LambdaLR's lr_lambdas; not OneCycleLR's phases, dicts): the head's, rates at the backbone's ratio; else
        # torch's strict zips fail.
        kept = {
            k: v * ratio if k.endswith("lr") else v for k, v in head.items() if k not in (*optimizer.defaults, "params")
        }
        for group in parameter_groups(backbone):
            optimizer.add_param_group({**kept, **group, "name": f"backbone_{group['name']}", **rates})
        for config in pl_module.trainer.lr_scheduler_configs:
            for name, values in vars(config.scheduler).items():
                if isinstance(values, list) and len(values) == before and not any(isinstance(v, dict) for v in values):
                    added = optimizer.param_groups[before:]
                    scaled = values[0] * ratio if name.endswith(("lrs", "_lr")) else values[0]
                    values += [g["initial_lr"] for g in added] if name == "base_lrs" else [scaled] * len(added)

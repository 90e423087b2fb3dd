"""Training and evaluation: config, loop, schedules, optimisers (AdamW, Lion), checkpoints, DDP, CLIs.

``train(cfg, out_dir)`` runs a config (``load_config(preset_or_yaml, overrides)``); see ``docs/training.md``.
"""

from attnzoo.train.config import ConfigError, TrainConfig, list_presets, load_config
from attnzoo.train.objectives import build_task_model
from attnzoo.train.optim import Lion, build_optimizer
from attnzoo.train.schedules import lr_at
from attnzoo.train.trainer import TrainResult, evaluate, train

__all__ = [
    "ConfigError",
    "Lion",
    "TrainConfig",
    "TrainResult",
    "build_optimizer",
    "build_task_model",
    "evaluate",
    "list_presets",
    "load_config",
    "lr_at",
    "train",
]

"""Deprecated name of :mod:`attnzoo.train.objectives` (renamed: ``attnzoo.data.tasks`` is where tasks are built).

Kept so that ``from attnzoo.train.tasks import compute_loss`` keeps working; import from
``attnzoo.train.objectives`` instead.
"""

from attnzoo.train.objectives import ARCH_FOR_KIND, MetricAccumulator, compute_loss, metric_names, task_model_overrides

__all__ = ["ARCH_FOR_KIND", "task_model_overrides", "compute_loss", "MetricAccumulator", "metric_names"]

"""Offline datasets and tasks: real data installed from package registries, LRA-style generators, ICL.

``build_task(name, **options)`` returns a :class:`Task` with ``train``/``val`` batch datasets; see
:mod:`attnzoo.data.tasks` for the batch layout of each task kind and :mod:`attnzoo.data.paths` for
where the data lives (``$ATTNZOO_DATA``, default ``~/.cache/attnzoo/data``).
"""

from attnzoo.data.datasets import ArrayDataset, BatchDataset, GeneratedDataset, ImageDataset, WindowDataset
from attnzoo.data.paths import DatasetNotFoundError, data_root
from attnzoo.data.tasks import TASK_KINDS, Task, build_task, list_tasks, task_options

__all__ = [
    "ArrayDataset",
    "BatchDataset",
    "DatasetNotFoundError",
    "GeneratedDataset",
    "ImageDataset",
    "TASK_KINDS",
    "Task",
    "WindowDataset",
    "build_task",
    "data_root",
    "list_tasks",
    "task_options",
]

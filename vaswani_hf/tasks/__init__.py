"""The tasks, side by side behind one seam (`base.Task`), as fairseq's `tasks/`: translation (the default) and
constituency parsing. Shared code asks a task for what differs; it never tests a task's name.

A new task: a module here subclassing `Task`, and one line in `TASKS`."""

from __future__ import annotations

from .base import Task
from .parsing import ParsingTask
from .translation import TranslationTask

TASKS: dict[str, Task] = {task.name: task for task in (TranslationTask(), ParsingTask())}
DEFAULT = "translate"


def task_named(name: str) -> Task:
    """The task of `--task NAME`."""
    if name not in TASKS:
        raise ValueError(f"--task {name}: choose one of {', '.join(TASKS)}.")
    return TASKS[name]


def task_of(config) -> Task:
    """The task a saved model was trained for: the one that owns its config, else the default."""
    return next((task for task in TASKS.values() if task.owns(config)), TASKS[DEFAULT])


__all__ = ["TASKS", "Task", "task_named", "task_of"]

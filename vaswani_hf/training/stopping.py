"""Stopping a run early, with a checkpoint: a signal (SIGINT, SIGTERM) or the time limit (`--max_train_minutes`).
Each callback holds one process's wish to stop; `VaswaniTrainer.decide_stop` decides for every process at once, so
under DDP all of them stop after the same update (trainer.py)."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .averaging import STOP_MARKER, list_checkpoints

logger = logging.getLogger(__name__)


def last_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete `checkpoint-N` folder of a run, or None."""
    checkpoints = list_checkpoints(output_dir) if Path(output_dir).is_dir() else []
    return checkpoints[-1] if checkpoints else None


class StopWithCheckpoint(TrainerCallback):
    """A stop that finishes the current step, writes a checkpoint and ends training. A checkpoint the save
    schedule did not ask for is marked, so that averaging leaves it out once a resumed run has gone past it:
    a run stopped and resumed then averages the same checkpoints as one that never stopped.

    A stop is this process's wish (`requested`, read on the host); the trainer decides it for every process at
    once (`VaswaniTrainer.decide_stop`), then calls `decided` on each: under DDP one rank alone never saves and
    waits for the others while they enter the next update's collective."""

    def __init__(self) -> None:
        self.unscheduled_save = False
        self.decided_at: int | None = None

    def requested(self) -> bool:
        return False

    def decide(self, control, state) -> None:
        """Stop after this update, once: Trainer looks again at the same update when an epoch ends."""
        if self.decided_at != state.global_step:
            self.decided_at = state.global_step
            self.decided(control, state)

    def decided(self, control, state) -> None:
        self.stop(control)

    def stop(self, control) -> None:
        # DefaultFlowCallback runs first and has already asked for the save when the schedule has one here
        self.unscheduled_save = self.unscheduled_save or not control.should_save
        control.should_save = control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.unscheduled_save and args.should_save:
            checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            (checkpoint / STOP_MARKER).write_text(json.dumps({"step": state.global_step}) + "\n")
        self.unscheduled_save = False


class WallClockCallback(StopWithCheckpoint):
    """Adds `elapsed_s` (seconds since training began) to every log entry, for curves against wall time,
    and stops training (with a checkpoint) once `max_train_minutes` have passed."""

    def __init__(self, max_train_minutes: float | None = None) -> None:
        super().__init__()
        self.max_seconds = max_train_minutes * 60 if max_train_minutes else math.inf
        self.start = time.perf_counter()
        self.stopped = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history:
            state.log_history[-1]["elapsed_s"] = round(time.perf_counter() - self.start, 1)

    def requested(self) -> bool:
        return time.perf_counter() - self.start > self.max_seconds

    def decided(self, control, state) -> None:
        logger.warning("time limit of %.1f minutes reached at step %d", self.max_seconds / 60, state.global_step)
        self.stop(control)
        self.stopped = True


class GracefulStopCallback(StopWithCheckpoint):
    """SIGINT or SIGTERM during training: finish the current step, write a checkpoint, stop. Under DDP the
    request is shared across processes so all of them stop at the same step. A second signal ends the process at
    once (exit 128 + signal), naming the last complete checkpoint: an update can take minutes while it compiles.
    `status`, when given, says what the update under way is doing ("compiling shape 3 of 6")."""

    def __init__(self, status: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.signal: int | None = None
        self.previous: dict[int, object] = {}
        self.status = status
        self.output_dir: str | None = None

    def _handle(self, signum, frame) -> None:
        if self.signal is not None:  # the second: now
            checkpoint = last_checkpoint(self.output_dir) if self.output_dir else None
            last = f"the last complete checkpoint is {checkpoint}" if checkpoint else "no checkpoint was written"
            print(f"\nstopped at once by a second {signal.Signals(signum).name}: {last}; continue with the same "
                  "command and --resume", file=sys.stderr, flush=True)  # fmt: skip
            sys.stdout.flush()
            for child in multiprocessing.active_children():  # loader processes ignore the signals: end them first
                child.kill()
            os._exit(128 + signum)
        self.signal = signum
        doing = self.status() if self.status is not None else None
        print(f"\n{signal.Signals(signum).name}: stopping after this update{f' ({doing})' if doing else ''}; send "
              "the signal again to stop now", file=sys.stderr, flush=True)  # fmt: skip

    def on_train_begin(self, args, state, control, **kwargs):
        self.output_dir = args.output_dir
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def requested(self) -> bool:
        return self.signal is not None

    def decided(self, control, state) -> None:
        self.stop(control)
        self.signal = self.signal or signal.SIGTERM  # another process was signalled

    def on_train_end(self, args, state, control, **kwargs):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

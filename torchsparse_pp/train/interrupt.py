"""Ctrl-C during training: the first one asks the loop to stop after the current step (it then
saves a checkpoint there), a second one aborts at once."""
import signal
import sys
import threading

__all__ = ["StopRequest", "TrainingInterrupted"]


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after saving ``checkpoint`` at ``step``."""

    def __init__(self, checkpoint, step: int, total_steps: int):
        super().__init__(f"interrupted at step {step} of {total_steps}; saved {checkpoint}")
        self.checkpoint, self.step, self.total_steps = checkpoint, step, total_steps


class StopRequest:
    """``with StopRequest() as stop:`` ... ``if stop.requested:`` — SIGINT sets the flag instead of
    raising in the middle of an optimizer step (which would leave the model half updated)."""

    def __init__(self, message: str = ""):
        self.requested = False
        self.message = message
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:  # the second Ctrl-C: stop now, without a checkpoint
            signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        if self.message:
            print(f"\n{self.message}", file=sys.stderr, flush=True)

    def __enter__(self) -> "StopRequest":
        # Signal handlers can only be set from the main thread; elsewhere Ctrl-C is not ours.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

"""What the real-process tests share: a child process stopped by its own pid, and the
fixture that stops every child a test started (never ``pkill``: only what the test made)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

PATIENT = 60.0
"""How long a child may take to end after SIGTERM before it is SIGKILLed."""


class ChildProcess:
    """A child process the test started; subclasses add what they read of its output."""

    proc: subprocess.Popen[Any]

    def stop(self) -> None:
        """SIGTERM this child (ours, by its pid), and SIGKILL it if it does not end in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(PATIENT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(PATIENT)

    def kill(self) -> None:
        """SIGKILL: no resignation, no release of its leases, cut wherever it was."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(PATIENT)


@pytest.fixture(name="children")
def child_processes() -> Iterator[list[Any]]:
    """The test's children, each stopped (by its pid) when the test ends."""
    started: list[Any] = []
    yield started
    for child in started:
        child.stop()

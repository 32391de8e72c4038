"""Argument checks shared by the parts and the system checks."""

from __future__ import annotations


def is_number(value: object) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value: object) -> bool:
    """An int (not a bool) of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_timeout_and_wait(timeout: float, wait: float) -> None:
    """The argument checks of locks and semaphores."""
    if not timeout > 0:
        raise ValueError("timeout must be a positive number of seconds")
    if wait < 0:
        raise ValueError("wait must be zero or a positive number of seconds")

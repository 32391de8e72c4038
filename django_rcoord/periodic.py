"""Periodic tasks (``RCOORD["PERIODIC_TASKS"]``): ``MISSED_AFTER`` and the schedule look-ups.

The code lives in ``django_rcoord.queues.periodic``; this module keeps the documented import path.
"""

from __future__ import annotations

from django_rcoord.queues.periodic import LATENESS_SAMPLES, MISSED_AFTER, schedule_status
from django_rcoord.queues.schedules import Schedule, schedules

__all__ = ["LATENESS_SAMPLES", "MISSED_AFTER", "Schedule", "schedule_status", "schedules"]

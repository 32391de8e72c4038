"""The delay queue and the delayed-task poller: ``DelayQueue``, ``DueTaskPromoter``.

The code lives in ``django_rcoord.queues.delayed``; this module keeps the documented import path.
"""

from __future__ import annotations

from django_rcoord.queues.delayed import DelayQueue, DueTaskPromoter, poll_queue

__all__ = ["DelayQueue", "DueTaskPromoter", "poll_queue"]

"""The staff dashboard's default permission (``RCOORD["DASHBOARD_PERMISSION"]``).

The code lives in ``django_rcoord.ops.dashboard``; this module keeps the documented import path.
"""

from __future__ import annotations

from django_rcoord.ops.dashboard import default_permission

__all__ = ["default_permission"]

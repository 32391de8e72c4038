"""SQLite's backend, with a server that refuses every connection.

Opening a connection fails as PostgreSQL's does when nothing listens, and so does the
check Django runs around each batch of a worker's tasks (``close_old_connections``): here
it connects, as a health check of a pooled server connection does. A worker meets the error
in its loop, not in a task, on every turn, for as long as the database stays down.
"""

from __future__ import annotations

from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        raise OperationalError(
            'connection to server at "db.internal" (10.0.0.5), port 5432 failed: Connection refused'
        )

    def close_if_unusable_or_obsolete(self) -> None:
        self.ensure_connection()

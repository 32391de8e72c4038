"""Tasks of the example project (workers import every installed app's ``tasks`` module)."""

from __future__ import annotations

from django_rcoord.queues import task
from example_project.market import Market


@task(name="example.relist_item", queue="market")
def relist_item(item_id: str, seller: str, price: int) -> None:
    """Put an item from the seller's inventory on the market (scheduled by "list later")."""
    Market("main").list_item(item_id, seller, price)

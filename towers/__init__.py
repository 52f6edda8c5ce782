"""Keras 3 towers: user towers map a behaviour sequence to K interest vectors ``[batch, K, d]``;
the item tower maps item ids to ``[batch, d]`` in the same space.

User towers are chosen by name from the registry::

    from towers import ItemTower, build_user_tower
    tower = build_user_tower("sa", item_tower=ItemTower(num_items + 1, 64), max_len=50, num_interests=4)
"""

from towers import bert4rec, bsarec, din, dr, fmlprec, sa, sasrec, youtubednn  # noqa: F401  (importing registers the towers)
from towers.base import UserTower
from towers.item import ItemTower
from towers.registry import build_user_tower, tower_names

__all__ = ["ItemTower", "UserTower", "build_user_tower", "tower_names"]

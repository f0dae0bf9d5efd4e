"""The item side of a model: its item table, in the forms training updates it with.

:class:`ItemTable` is the table (dense); :mod:`recsys.items.row_sparse` registers the row-sparse
form and :mod:`recsys.items.sharded` the sharded one, both on the per-row Adam of
:mod:`recsys.items.row_adam`. Importing the package registers every form of :data:`FORMS`.
"""

from recsys.items.row_sparse import RowSparseTable
from recsys.items.sharded import ShardedTable
from recsys.items.table import FORMS, FeatureUse, ItemTable, RowUpdates, find_item_table, new_items, register_form

__all__ = [
    "FORMS",
    "FeatureUse",
    "ItemTable",
    "RowSparseTable",
    "RowUpdates",
    "ShardedTable",
    "find_item_table",
    "new_items",
    "register_form",
]

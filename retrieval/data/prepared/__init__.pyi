"""The public API of :mod:`retrieval.data.prepared` (loaded on first use by ``__init__.py``)."""

from .partitions import EVENTS_PER_PARTITION, MAX_PARTITIONS
from .reader import (
    KIND,
    EvalBatch,
    Prepared,
    count_examples,
    is_prepared,
    iter_eval_batches,
    iter_pieces,
    open_prepared,
    read_item_attributes,
    read_vocab,
    side_vocab,
)
from .writer import BATCH_ROWS, FORMATS, USERS_PER_ROW_GROUP, PreparedSummary, prepare, prepare_dataset

__all__ = [
    "BATCH_ROWS",
    "EVENTS_PER_PARTITION",
    "FORMATS",
    "KIND",
    "MAX_PARTITIONS",
    "USERS_PER_ROW_GROUP",
    "EvalBatch",
    "Prepared",
    "PreparedSummary",
    "count_examples",
    "is_prepared",
    "iter_eval_batches",
    "iter_pieces",
    "open_prepared",
    "prepare",
    "prepare_dataset",
    "read_item_attributes",
    "read_vocab",
    "side_vocab",
]

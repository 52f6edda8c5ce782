"""The public API of :mod:`retrieval.data` (loaded on first use by ``__init__.py``)."""

from .columns import TIMESTAMP_UNITS, TimestampUnit, parse_columns
from .datasets import DATA_ROOT_ENV, DATASETS, data_root, dataset_at, dataset_path
from .errors import DataError
from .features import (
    SIDE_FEATURES,
    SideVocab,
    build_side_vocab,
    encode_events,
    gap_buckets,
    history_features,
    parse_side_features,
    user_event_features,
)
from .interactions import Interactions, SequenceData, build_sequences
from .loaders import load_interactions
from .movielens import download_movielens_100k, load_movielens, verify_movielens_100k
from .prepared.partitions import EVENTS_PER_PARTITION, MAX_PARTITIONS
from .prepared.reader import (
    EvalBatch,
    Prepared,
    count_examples,
    is_prepared,
    iter_eval_batches,
    open_prepared,
    read_vocab,
)
from .prepared.writer import (
    BATCH_ROWS,
    FORMATS,
    USERS_PER_ROW_GROUP,
    PreparedSummary,
    prepare,
    prepare_dataset,
)
from .recbole import load_recbole
from .s3rec import load_s3rec, load_sasrec
from .splits import (
    DEFAULT_SEED,
    PROTOCOLS,
    ComirecSplit,
    EvaluationProtocol,
    LeaveOneOut,
    comirec_split,
    history_length,
    leave_one_out,
    sample_negatives,
)
from .tables import frame_source, interactions_from_frame, load_table
from .vocab import PAD, ItemVocab

__all__ = [
    "BATCH_ROWS",
    "DATASETS",
    "DATA_ROOT_ENV",
    "DEFAULT_SEED",
    "EVENTS_PER_PARTITION",
    "FORMATS",
    "MAX_PARTITIONS",
    "PAD",
    "PROTOCOLS",
    "SIDE_FEATURES",
    "TIMESTAMP_UNITS",
    "USERS_PER_ROW_GROUP",
    "ComirecSplit",
    "DataError",
    "EvalBatch",
    "EvaluationProtocol",
    "Interactions",
    "ItemVocab",
    "LeaveOneOut",
    "Prepared",
    "PreparedSummary",
    "SequenceData",
    "SideVocab",
    "TimestampUnit",
    "build_sequences",
    "build_side_vocab",
    "comirec_split",
    "count_examples",
    "data_root",
    "dataset_at",
    "dataset_path",
    "download_movielens_100k",
    "encode_events",
    "frame_source",
    "gap_buckets",
    "history_features",
    "history_length",
    "interactions_from_frame",
    "is_prepared",
    "iter_eval_batches",
    "leave_one_out",
    "load_interactions",
    "load_movielens",
    "load_recbole",
    "load_s3rec",
    "load_sasrec",
    "load_table",
    "open_prepared",
    "parse_columns",
    "parse_side_features",
    "prepare",
    "prepare_dataset",
    "read_vocab",
    "sample_negatives",
    "user_event_features",
    "verify_movielens_100k",
]

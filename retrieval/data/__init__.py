"""Interaction data: loaders, per-user sequences, splits, side features and the prepared layout.

* :mod:`~retrieval.data.loaders`: :func:`load_interactions` reads every supported format
  (:mod:`~retrieval.data.movielens`, :mod:`~retrieval.data.s3rec`, :mod:`~retrieval.data.tables`)
  into one in-memory form; every problem is a :class:`DataError` naming the file and line.
* :mod:`~retrieval.data.interactions`: :class:`Interactions` and the per-user
  :class:`SequenceData` (:func:`build_sequences`) in a dense item :mod:`~retrieval.data.vocab`.
* :mod:`~retrieval.data.datasets`: named public datasets under a data root (``MITT_DATA``).
* :mod:`~retrieval.data.splits`: leave-one-out, ComiRec's user split, sampled negatives.
* :mod:`~retrieval.data.features`: side features (attributes, actions, time gaps).
* :mod:`retrieval.data.prepared`: data larger than memory as partitioned Parquet, its writer
  (:func:`prepare`) and readers.

No TensorFlow here (a test checks): pandas, pyarrow and numpy only.
"""

from retrieval.data.datasets import DATA_ROOT_ENV, DATASETS, data_root, dataset_at, dataset_path
from retrieval.data.features import (
    SIDE_FEATURES,
    SideVocab,
    build_side_vocab,
    encode_events,
    gap_buckets,
    history_features,
    parse_side_features,
    user_event_features,
)
from retrieval.data.interactions import DataError, Interactions, SequenceData, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.movielens import (
    download_movielens_100k,
    load_movielens,
    verify_movielens_100k,
)
from retrieval.data.prepared import (
    BATCH_ROWS,
    EVENTS_PER_PARTITION,
    FORMATS,
    MAX_PARTITIONS,
    USERS_PER_ROW_GROUP,
    EvalBatch,
    Prepared,
    count_examples,
    is_prepared,
    iter_eval_batches,
    open_prepared,
    prepare,
    prepare_dataset,
    read_vocab,
)
from retrieval.data.s3rec import load_s3rec
from retrieval.data.splits import (
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
from retrieval.data.tables import load_table
from retrieval.data.vocab import PAD, ItemVocab

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
    "USERS_PER_ROW_GROUP",
    "ComirecSplit",
    "DataError",
    "EvalBatch",
    "EvaluationProtocol",
    "Interactions",
    "ItemVocab",
    "LeaveOneOut",
    "Prepared",
    "SequenceData",
    "SideVocab",
    "build_sequences",
    "build_side_vocab",
    "comirec_split",
    "count_examples",
    "data_root",
    "dataset_at",
    "dataset_path",
    "download_movielens_100k",
    "encode_events",
    "gap_buckets",
    "history_features",
    "history_length",
    "is_prepared",
    "iter_eval_batches",
    "leave_one_out",
    "load_interactions",
    "load_movielens",
    "load_s3rec",
    "load_table",
    "open_prepared",
    "parse_side_features",
    "prepare",
    "prepare_dataset",
    "read_vocab",
    "sample_negatives",
    "user_event_features",
    "verify_movielens_100k",
]

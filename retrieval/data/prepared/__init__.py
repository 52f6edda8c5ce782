"""Interaction data larger than memory: a partitioned Parquet layout, its writer and its readers.

:func:`prepare` converts an input into the layout below; :mod:`retrieval.training.streaming`
streams its training examples into ``tf.data`` and :func:`iter_eval_batches` its evaluation users.
Inputs:

* every format :func:`retrieval.data.loaders.load_interactions` reads (``movielens``, ``s3rec``,
  ``table``): loaded in memory and put through :func:`~retrieval.data.interactions.build_sequences` and
  :func:`~retrieval.data.splits.leave_one_out` unchanged;
* ``dataset``: a raw ``user, item, timestamp`` table too large for memory (+ optional ``title``
  and side columns such as ``rating``): a folder of Parquet (or CSV) files, one such file, or a
  URI of any file system Arrow supports (``s3://…``, ``gs://…``, ``hdfs://…``), read out of core
  by :func:`~retrieval.data.prepared.writer.prepare_dataset` with the same result as the in-memory path.

Layout of the prepared folder ``DIR`` (an artifact of kind ``prepared-data``: written to a
temporary folder and renamed into place, ``manifest.json`` holds the metadata and every file's
SHA-256)::

    manifest.json            kind "prepared-data", source, format, partitions, users, items, events,
                             train_events, has_time, event_columns, users_per_row_group,
                             largest_partition_events, checksums
    vocab.json               ItemVocab.save: external ids, dense id i + 1 = ids[i] (0 = padding), titles
    item_attributes.json     external item id -> attributes (only when the input has them)
    item_counts.parquet      one row per dense id 0..n (row 0 = padding), int64 columns:
                             events (all), train (in training sequences), first (training
                             sequences starting with it)
    sequences/part-00000.parquet … part-<N-1>.parquet, one row per user:
        user          string       external user id
        items         list<int32>  dense item ids, oldest first: the whole sequence, held-out items too
        timestamp     list<int64>  per event (0-based positions when has_time is false)
        <column>      list<…>      every other event column of the input (e.g. rating), per event
        train_len     int32        training events: len when len < 3, else len - 2
        valid_target  int32        items[len - 2] when len >= 3, else 0 (the user is not evaluated)
        test_target   int32        items[len - 1] when len >= 3, else 0
      in row groups of at most ``users_per_row_group`` users: the readers' unit of memory.

The split is leave-one-out (:class:`~retrieval.data.splits.LeaveOneOut`): ``items[:train_len]`` trains,
validation reads ``items[:len - 2]`` -> ``valid_target``, test ``items[:len - 1]`` -> ``test_target``.

A user's partition is :func:`~retrieval.data.prepared.partitions.partition_of`:
``pandas.util.hash_array(ids, categorize=False) % partitions`` over the ids as text (SipHash with
pandas' fixed key: the same on every machine). Within a file users come in order of first
appearance in the input (for a folder: its files sorted by path, each file's rows in order). Item
numbering and event order are those of :func:`~retrieval.data.build_sequences`: items by first
appearance after a stable sort by timestamp, each user's events by timestamp, ties in input order.

Memory of the ``dataset`` path: pass 1 scans the input in record batches of ``batch_rows`` rows
(default 256k; ~300 bytes per row while a batch is cast, hashed and split), keeping per item its
first ``(timestamp, row)`` (~100 bytes per item), and appends every batch's rows to its users'
partition staging file; pass 2 loads one partition at a time, numbers its items, sorts and
writes it (~200 bytes per event). Peak memory is therefore set by the largest partition, not by
the input, and the partition count is chosen from the input's size (``events_per_partition``
events each, default 2M; measured: 480-525 MB peak RSS with 1.7M-event partitions, imports
included). The assumption: a partition fits in memory, i.e. there are many users and none of
them alone outgrows memory.
"""

from retrieval.data.prepared.partitions import EVENTS_PER_PARTITION
from retrieval.data.prepared.reader import (
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
from retrieval.data.prepared.writer import USERS_PER_ROW_GROUP, prepare, prepare_dataset

__all__ = [
    "EVENTS_PER_PARTITION",
    "USERS_PER_ROW_GROUP",
    "EvalBatch",
    "Prepared",
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

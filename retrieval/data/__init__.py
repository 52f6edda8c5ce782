"""Interaction data: loaders, per-user sequences, splits, side features and the prepared layout.

* :mod:`~retrieval.data.loaders`: :func:`load_interactions` reads every supported format
  (:mod:`~retrieval.data.movielens`, :mod:`~retrieval.data.s3rec` (S3-Rec and SASRec),
  :mod:`~retrieval.data.tables` (CSV, TSV, Parquet, DataFrames), :mod:`~retrieval.data.recbole`)
  into one in-memory form, tables under any column names (:mod:`~retrieval.data.columns`);
  every problem is a :class:`DataError` naming the file and line.
* :mod:`~retrieval.data.interactions`: :class:`Interactions` and the per-user
  :class:`SequenceData` (:func:`build_sequences`) in a dense item :mod:`~retrieval.data.vocab`.
* :mod:`~retrieval.data.datasets`: named public datasets under a data root (``MITT_DATA``);
  :mod:`~retrieval.data.download`: retried, resumed downloads (:func:`download_movielens_100k`).
* :mod:`~retrieval.data.splits`: leave-one-out, ComiRec's user split, sampled negatives.
* :mod:`~retrieval.data.features`: side features (attributes, actions, time gaps).
* :mod:`retrieval.data.prepared`: data larger than memory as partitioned Parquet, its writer
  (:func:`prepare`) and readers.

No TensorFlow here (a test checks): pandas, pyarrow and numpy only. Names load on first use
(``lazy_loader``, from ``__init__.pyi``): ``mitt train --help``, ``mitt evaluate --help`` and
``mitt train-ranker --help`` read constants here, and an eager import would load pandas and
pyarrow into them.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)

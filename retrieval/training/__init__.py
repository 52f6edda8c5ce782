"""Training: the two-tower model, its task, its input pipelines and the training loop.

* :mod:`~retrieval.training.config`: :class:`Config` (data, model, train sections), the option
  values (``LOSSES``, ``SAMPLERS``...) and :mod:`~retrieval.training.presets`, named
  configurations per dataset and tower; overrides and config files are :mod:`retrieval.config`'s.
* :mod:`~retrieval.training.model`: :class:`TwoTowerModel`, a user tower (:mod:`towers`) and
  the task that trains it; :mod:`retrieval.training.losses`: the task (negatives, samplers,
  log-Q correction, accidental hits, how K interests meet a target).
* :mod:`~retrieval.training.examples`, :mod:`~retrieval.training.inputs`,
  :mod:`~retrieval.training.batches`, :mod:`~retrieval.training.streaming`: examples per
  objective, in memory or streamed from a prepared folder.
* :mod:`~retrieval.training.run`: :func:`train`, checkpointed every epoch and resumable, with
  full-ranking validation (:mod:`~retrieval.training.validation`), callbacks, the optimizer and
  ``tf.distribute`` (:mod:`~retrieval.training.distribute`).
* :mod:`~retrieval.training.attention`: a trained tower's attention maps.

Names load on first use (``lazy_loader``, from ``__init__.pyi``): ``mitt train --help`` reads
:class:`Config` and the option names here, and an eager import would load TensorFlow into it.

Example:
    >>> config = apply_overrides(Config(), ["data.path=log.csv", "model.tower=sasrec"])
    >>> train(config, Path("runs/sasrec"))
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)

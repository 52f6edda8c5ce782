"""The command lines: ``mitt COMMAND [ARGS]``, the top layer of :mod:`retrieval`.

One module per command (``prepare``, ``train``, ``evaluate``, ``build_index``, ``train_ranker``,
``deploy``, ``serve``, ``query``, ``plot_attention``), each ``main(argv, prog)``: parse the
arguments into a configuration, call the library, print the result. :mod:`~retrieval.cli.dispatch`
is the ``mitt`` command itself (the console script installed with the package), which imports a
command's module only once it is chosen; ``tools/<name>.py`` run the same ``main`` as scripts.

A command parses its arguments before it imports anything heavy: every ``--help`` loads no
TensorFlow, Keras, FAISS or pandas, and TensorFlow stays quiet unless ``--verbose``
(:func:`retrieval.environment.quiet_tensorflow`). Nothing below imports this layer.

Example:
    >>> from retrieval.cli import main
    >>> main(["train", "--data", "data/ml-100k", "--out", "runs/ml100k-sa"])  # doctest: +SKIP
"""

from retrieval.cli.dispatch import main

__all__ = ["main"]

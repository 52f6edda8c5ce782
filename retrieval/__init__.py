"""Training, evaluation, artifacts and serving for the multi-interest two-tower retriever.

Importing it changes nothing in the process: the tools choose how much TensorFlow logs
(:func:`retrieval.environment.quiet_tensorflow`).
"""

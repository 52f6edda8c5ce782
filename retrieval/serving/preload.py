"""What a serving group's worker processes share: imported once, before they are forked.

A group's workers are forked by multiprocessing's fork server, a fresh interpreter that imports
this module and nothing else. Importing TensorFlow, Keras, FAISS and NumPy costs each process a
few hundred megabytes of heap (Python objects, TensorFlow's registries of ops and kernels) that
no request writes to again; forked from one process, the workers keep those pages shared
instead of holding a copy each. The fork server has run no TensorFlow op, started no gRPC
server and loaded no model, so a fork of it is as safe as a fresh interpreter.

:func:`gc.freeze` moves every object imported here out of the garbage collector's reach: a
collection in a worker would otherwise write to each object's header and copy every page.
TensorFlow's start-up log lines follow ``TF_CPP_MIN_LOG_LEVEL`` as the supervisor left it
(:func:`~retrieval.environment.quiet_tensorflow`).
"""

import gc
import os

from retrieval.environment import LOG_LEVEL_ENV, quiet_tensorflow

if LOG_LEVEL_ENV in os.environ:  # set by a quiet supervisor, or the user: the start-up lines obey it
    quiet_tensorflow()

import faiss  # noqa: F401
import keras  # noqa: F401
import numpy  # noqa: F401
import tensorflow  # noqa: F401

gc.freeze()

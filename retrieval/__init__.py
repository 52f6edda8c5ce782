"""Training, evaluation, artifacts and serving for the multi-interest two-tower retriever."""

import os

# TensorFlow's C++ INFO/WARNING lines (oneDNN, CPU features) drown our own output; an explicit
# setting by the user wins. Must happen before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

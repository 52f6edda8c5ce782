"""Training, evaluation, artifacts and serving for the multi-interest two-tower retriever."""

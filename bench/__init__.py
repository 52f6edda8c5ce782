"""Benchmarks: plain scripts printing recall and latency (run as ``python -m bench.<name>``)."""

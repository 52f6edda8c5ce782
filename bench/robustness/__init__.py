"""Robustness benchmark: property-based fuzzing of every RPC against a real server, and a soak.

    python -m bench.robustness --fuzz 10000                 # synthetic model, server in a child process
    python -m bench.robustness --fuzz 1000 --model MODEL_DIR --index INDEX_DIR --max-message-mb 4
    python -m bench.robustness --soak 600                   # 10 min at 80% of max QPS, a reload halfway
    python -m bench.robustness --abuse 10                   # oversized, heavy flood, deadlines
    python -m bench.robustness --deploys                    # bad versions deployed, served, restarted
    python -m bench.robustness --group                      # a serving group's workers killed, stopped
    python -m bench.robustness --fuzz 1000 --engine native  # any run against the native engine

``--engine python|native`` (default ``python``) is the engine of every server a run starts; the
checks are the same for both.

Requests come from one Hypothesis generator (:func:`~bench.robustness.strategies.calls`, shared
with ``tests/serving/test_fuzz_rpc.py``): ``Retrieve``, ``BatchRetrieve`` and ``GetModelInfo`` with
random, huge and out-of-range numbers, empty and huge lists, unknown and duplicate ids, NaN/inf
``diversity_lambda``, odd unicode, known and unknown ``category``, oversized messages, hand-made
wire bytes (a negative varint for ``k``, unknown fields) and, unless ``--no-undecodable``, bytes
that are not a valid message (invalid UTF-8 in a string field, truncated or random bytes).

Every answer must be what the API documents (:func:`~bench.robustness.oracle.check_call`): a
valid result (at most ``k`` distinct known items, none from the history or ``exclude_ids``, only
``allow_ids`` when given, ``k`` of them whenever ``k`` items pass, finite scores, best first for
max-score) or ``INVALID_ARGUMENT`` / ``RESOURCE_EXHAUSTED`` / ``DEADLINE_EXCEEDED`` with a message,
as the documented limits predict; never ``INTERNAL`` or ``UNKNOWN``. The server runs in its own process:
a good request is checked every 100 calls and at the end, and the process must still be alive.
Prints the counts per method and status code, the violations by kind (one example of each in
full; ``--violations FILE`` keeps all, with their request bytes), the time and the rate; exits 1
on any violation.

``--soak SECONDS`` (:func:`~bench.robustness.soak.run_soak`) trains two versions of a model
(``--soak-tower``, one epoch on ML-100K under ``--data-root`` by default, seeds 1 and 2; cached in
``--out``/soak-versions) with a Flat index each, publishes the first to a deployment root and
serves it with ``tools/serve.py --watch ROOT`` in a child process. It measures the server's max
QPS (32 calls in flight for ``--probe-seconds``), then sends 80% of it (``--load-fraction``) on
a fixed schedule for SECONDS, the requests being the data's users' histories; halfway,
``tools/deploy.py`` publishes the second version, which the server must swap in without a failed
call. Prints one row per tenth of the run (requests, errors,
p50/p99/max latency, send lag, which versions answered, the server's RSS from
``/proc/PID/status``), the totals, and the checks: no errors, the new version answering after the
swap and only the old one before, RSS growth under 5%, and the rate held (95% of the scheduled
calls answered within the run: on a shared machine the capacity measured by the probe may not
last); writes ``soak-<SECONDS>s.json`` and ``.md`` to ``--out`` (default
``runs/bench-robustness``). Exits 1 if a check fails.

``--abuse SECONDS`` (:mod:`~bench.robustness.abuse`, on the soak's first version, cached): one
``tools/serve.py`` child per case. Oversized repeated fields: 8 requests of 30 MiB and 8 of
4 MiB (450,000 excluded ids) at once must all be refused and leave the server's resident memory
within 10% of its idle value. Heavy-batch flood: a cheap ``Retrieve`` every 10 ms, idle and then
for SECONDS while 8 threads send batches of 256 histories of 1,500 ids back to back (waiting the
server's pushback when refused): no cheap call may fail and its p99 must stay within 10x of idle;
the server's peak memory is reported against its ``--max-memory-mb`` (``--abuse-ceiling-mb``).
Medium burst: 200 batches of 64 histories at once, and a cheap ``Retrieve`` 0.5 s later must take
at most 10x the idle p99.
Deadline expiry: batches with a 0.2 s deadline must stop on the server (its CPU after them under
half of one whole call's time) and be counted ``DEADLINE_EXCEEDED``. Prints one row per case;
exits 1 if a case fails.

``--deploys`` (:func:`~bench.robustness.deploys.run_deploys`, on the soak's two versions, cached):
copies of the second version that pass every checksum but cannot serve (a NaN item embedding, a
NaN index vector, a user tower that does not load) go through ``tools/deploy.py`` while
``tools/serve.py --watch`` serves the first: each must be refused (exit code 2, one line,
``current`` unchanged) and the server must keep answering. The broken one, published without
the deploy's check, must be refused by the running server (``GetModelInfo.reload_refusals``), and
a restart on it must start, serving the first version with an ERROR line naming both. A version
published between a server's load and its watcher's start must be served within two polls. A
``tools/deploy.py`` of the second version and six ``tools/add_items.py --remove`` started 0.1 s
apart write one root at once: all must exit 0, each version published over the one before, and
every removal published after the deploy in ``current``.
Prints one row per case with its figures; exits 1 if a case fails.

``--group`` (:mod:`~bench.robustness.workers`, on the soak's first version, cached): a
``tools/serve.py --processes 2`` child per case: kill -9 of a worker under load (failed calls
and health probes not SERVING counted), SIGSTOP of a worker (detected and replaced within the
heartbeat's bound), SIGTERM once and twice with a worker stopped (the time to exit against
``--grace`` and the margin). Prints one row per case; exits 1 if a case fails.

Modules: :mod:`~bench.robustness.calls` (the documented limits, one call),
:mod:`~bench.robustness.strategies` (the generator), :mod:`~bench.robustness.oracle` (what an
answer must be), :mod:`~bench.robustness.server` (the fuzzed server), :mod:`~bench.robustness.fuzz`
(sending and reporting), :mod:`~bench.robustness.processes` (the tools and the watching server in
child processes), :mod:`~bench.robustness.soak` and :mod:`~bench.robustness.soak_report` (the
soak), :mod:`~bench.robustness.deploys` (the deploy cases), :mod:`~bench.robustness.cli` (the
command line).
"""

from bench.robustness.calls import FUZZ_MAX_MESSAGE_BYTES, Call, make_call
from bench.robustness.cli import main, parse_args
from bench.robustness.deploys import Case, broken_tower, nan_embeddings, nan_index, resign, run_deploys
from bench.robustness.fuzz import FuzzClient, FuzzReport, run_fuzz
from bench.robustness.oracle import Served, check_call, check_result, expected_codes, invalid_reason
from bench.robustness.processes import model_version_of, rss_kb, start_watching_server
from bench.robustness.server import SYNTHETIC_ATTRIBUTES, SYNTHETIC_ITEMS, served_by, synthetic_retriever
from bench.robustness.soak import Version, build_versions, hold_rate, run_soak
from bench.robustness.soak_report import SoakTrace, soak_table, summarise_soak
from bench.robustness.strategies import RequestStrategies, calls

__all__ = [
    "FUZZ_MAX_MESSAGE_BYTES",
    "SYNTHETIC_ATTRIBUTES",
    "SYNTHETIC_ITEMS",
    "Call",
    "Case",
    "FuzzClient",
    "FuzzReport",
    "RequestStrategies",
    "Served",
    "SoakTrace",
    "Version",
    "broken_tower",
    "build_versions",
    "calls",
    "check_call",
    "check_result",
    "expected_codes",
    "hold_rate",
    "invalid_reason",
    "main",
    "make_call",
    "model_version_of",
    "nan_embeddings",
    "nan_index",
    "parse_args",
    "resign",
    "rss_kb",
    "run_deploys",
    "run_fuzz",
    "run_soak",
    "served_by",
    "soak_table",
    "start_watching_server",
    "summarise_soak",
    "synthetic_retriever",
]

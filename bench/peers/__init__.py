"""Side by side with the libraries teams use today: RecBole and DeepMatch, same data, same split.

    python -m bench.peers --smoke      # the pipeline: ML-100K's first 200 users, 1 epoch, every model
    python -m bench.peers --data ../shared/data/amazon-beauty/Beauty.txt --peer-minutes 25

Each peer is installed by this benchmark into a virtual environment of its own under ``--cache``
(never into the project's), and runs its own model code and training loop in its own process
(``bench/peers/runners/*_runner.py``, standalone scripts). The benchmark writes the split (and, for
RecBole, the atomic files) with our external item ids; a runner trains, then exports after
every epoch the user vectors of the evaluation users and the item vectors, keyed by our ids.
This process evaluates every side with our evaluator (exact full ranking, history excluded,
``retrieval.evaluation.exact_top_k`` + ``retrieval.evaluation.metrics``) on the identical split, so
that only the models differ:

* ``loo``: leave-one-out (``retrieval.data.splits.leave_one_out``), HR/NDCG/Recall@10/20/50: our
  ``sasrec``, ``bert4rec`` and a multi-interest tower vs RecBole's SASRec (cross-entropy) and
  BERT4Rec.
* ``comirec``: ComiRec's user split (``retrieval.data.splits.comirec_split``), Recall/HR/NDCG@20/50
  in ComiRec's definitions: our ``sa``, ``dr``, ``mind``, ``youtubednn`` vs DeepMatch's
  ComiRec-SA, ComiRec-DR, MIND, YouTubeDNN. Models train on the training users only.

Both sides of a pair train for the same number of epochs (``--epochs``, or by default our
tower's budget: its preset's, e.g. 39 for ``beauty-sasrec``, else 20), and every side at the same
batch size, embedding size and history length (ours from each tower's preset for the dataset,
``retrieval/training/presets.py``, when ``--data`` is a named dataset under ``--data-root``, with
these shared settings replacing the preset's; ``--no-presets``: defaults), and is scored at its
best validation epoch (validation NDCG@10 under ``loo``, Recall@50 under ``comirec``, by our
evaluator; ours trains with ``tools/train.py``'s protocol of the same name). Speed: training
seconds per epoch (validation and checkpoints excluded) and target events per second, the ratio
ours/peer, the training time each side needs to reach the peer's best validation metric, and the
peak RSS of each process. ``--peer-minutes`` caps each peer's training time (the issue's
reference is RecBole SASRec after 25 minutes). Finished runs are read back, not redone, when their
settings are the same (and, for ours, the whole training configuration: an edited preset retrains).

Modules: :mod:`~bench.peers.plan` (what runs), :mod:`~bench.peers.splits` (the data and the
split, written for the runners), :mod:`~bench.peers.envs` (the peers' venvs and their runners'
command lines), :mod:`~bench.peers.ours` (our towers' configurations and worker),
:mod:`~bench.peers.runs` (one run in its own process, read back), :mod:`~bench.peers.evaluation`
(our evaluator on exported vectors), :mod:`~bench.peers.report` (the comparison and tables),
:mod:`~bench.peers.cli` (the command line).
"""

from bench.peers.cli import main, parse_args, run_benchmark
from bench.peers.envs import (
    DEFAULT_CACHE,
    PEER_ENVS,
    RUNNERS,
    PeerEnv,
    ensure_env,
    find_torch_wheel,
    install_commands,
    peer_command,
)
from bench.peers.evaluation import (
    COMIREC_KS,
    LOO_KS,
    SELECT_BY,
    align_items,
    evaluate_vectors,
    validation_metrics,
)
from bench.peers.ours import ours_base_config, ours_config, ours_preset, ours_worker, run_settings
from bench.peers.plan import PAIRS, ModelRun, Settings, model_runs
from bench.peers.report import HEADLINE, compare, markdown, time_to_reach, write_report
from bench.peers.runs import execute, run_process, speed, summarize
from bench.peers.splits import (
    PROTOCOLS,
    BenchSplit,
    check_recbole_split,
    make_split,
    recbole_atomic_inter,
    split_payload,
    write_split,
)

__all__ = [
    "COMIREC_KS",
    "DEFAULT_CACHE",
    "HEADLINE",
    "LOO_KS",
    "PAIRS",
    "PEER_ENVS",
    "PROTOCOLS",
    "RUNNERS",
    "SELECT_BY",
    "BenchSplit",
    "ModelRun",
    "PeerEnv",
    "Settings",
    "align_items",
    "check_recbole_split",
    "compare",
    "ensure_env",
    "evaluate_vectors",
    "execute",
    "find_torch_wheel",
    "install_commands",
    "main",
    "make_split",
    "markdown",
    "model_runs",
    "ours_base_config",
    "ours_config",
    "ours_preset",
    "ours_worker",
    "parse_args",
    "peer_command",
    "recbole_atomic_inter",
    "run_benchmark",
    "run_process",
    "run_settings",
    "speed",
    "split_payload",
    "summarize",
    "time_to_reach",
    "validation_metrics",
    "write_report",
    "write_split",
]

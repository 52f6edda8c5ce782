"""Side by side with the libraries teams use today: RecBole and DeepMatch, same data, same split.

    python -m bench.peers --smoke      # the pipeline: ML-100K's first 200 users, 1 epoch, every model
    python -m bench.peers --data ../shared/data/amazon-beauty/Beauty.txt --peer-minutes 25

Each peer is installed by this script into a virtual environment of its own under ``--cache``
(never into the project's), and runs its own model code and training loop in its own process
(``bench/peers/*_runner.py``, standalone scripts). The benchmark writes the split (and, for
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
``retrieval/presets.py``, when ``--data`` is a preset dataset, with these shared settings
replacing the preset's; ``--no-presets``: defaults), and is scored at its best validation epoch
(validation NDCG@10 under ``loo``, Recall@50 under ``comirec``, by our evaluator; ours trains
with ``tools/train.py``'s protocol of the same name). Speed: training seconds per epoch
(validation and checkpoints excluded) and target events per second, the ratio ours/peer, the
training time each side needs to reach the peer's best validation metric, and the peak RSS of
each process. ``--peer-minutes`` caps each peer's training time (the issue's reference is
RecBole SASRec after 25 minutes). Finished runs are read back, not redone, when their settings
are the same (and, for ours, the whole training configuration: an edited preset retrains).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from retrieval.training import Config

REPO = Path(__file__).resolve().parent.parent
RUNNERS = Path(__file__).resolve().parent / "peers"
DEFAULT_CACHE = Path.home() / ".cache" / "mitt-peers"
TORCH_WHEEL_GLOB = "torch-2.13.0+cpu-cp311-cp311-*.whl"
WHEEL_DIRS = (Path("/opt/wheels"),)
"""Where a local CPU build of torch is looked for when ``--torch-wheel`` is not given (also every
folder of ``PIP_FIND_LINKS``)."""


# --------------------------------------------------------------------------- peer environments


@dataclass(frozen=True)
class PeerEnv:
    """How one peer library is installed and run.

    Attributes:
        name: the peer (``recbole``, ``deepmatch``); also its venv folder under the cache.
        runner: the script under ``bench/peers/`` run with the venv's Python.
        requirements: installed together, with dependencies.
        no_deps: installed afterwards with ``--no-deps`` (packages whose declared dependencies
            would pull a second, larger build of something already there).
        env: environment variables every run of the runner gets.
    """

    name: str
    runner: str
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


PEER_ENVS = {
    "recbole": PeerEnv(
        "recbole",
        "recbole_runner.py",
        ("torch==2.13.0", "recbole==1.2.1", "numpy<2", "pandas<3", "setuptools<81"),
        env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
    ),
    "deepmatch": PeerEnv(
        "deepmatch",
        "deepmatch_runner.py",
        ("tensorflow-cpu==2.21.0", "deepmatch==0.3.2"),
        # tf-keras depends on `tensorflow` by name: with its deps it would add the 572 MB build.
        no_deps=("tf-keras==2.21.0",),
        env={"TF_USE_LEGACY_KERAS": "1"},
    ),
}


def find_torch_wheel(given: Path | None = None) -> Path | None:
    """The local torch CPU wheel: ``given`` if set, else the first match in :data:`WHEEL_DIRS`
    and ``PIP_FIND_LINKS``; ``None`` when there is none (torch then comes from the index)."""
    if given is not None:
        if not given.is_file():
            raise FileNotFoundError(f"--torch-wheel {given}: no such file")
        return given
    folders = [*WHEEL_DIRS, *(Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if p)]
    for folder in folders:
        found = sorted(folder.glob(TORCH_WHEEL_GLOB)) if folder.is_dir() else []
        if found:
            return found[-1]
    return None


def base_python() -> str:
    """The interpreter new venvs are made with: the base Python behind the running one (the
    project's venv Python would do too, but the base one never inherits its packages)."""
    return getattr(sys, "_base_executable", "") or shutil.which("python3") or "python3"


def install_commands(peer: PeerEnv, venv: Path, torch_wheel: Path | None = None) -> list[list[str]]:
    """The commands that create ``venv`` and install ``peer`` into it (a local torch wheel
    replaces the ``torch==`` requirement when given)."""
    python = str(venv / "bin" / "python")
    requirements = [
        str(torch_wheel) if torch_wheel is not None and r.startswith("torch==") else r
        for r in peer.requirements
    ]
    commands = [
        [base_python(), "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", "--quiet", *requirements],
    ]
    if peer.no_deps:
        commands.append([python, "-m", "pip", "install", "--quiet", "--no-deps", *peer.no_deps])
    return commands


def ensure_env(peer: PeerEnv, cache: Path, torch_wheel: Path | None = None) -> dict[str, Any]:
    """Creates ``cache/<peer>`` and installs the peer into it, unless a finished install of the
    same requirements is there already.

    Returns:
        ``{"venv", "python", "installed_now", "install_seconds", "packages"}``; the seconds are
        those of the install that made the venv (read back when it was already there).
    """
    venv = cache / peer.name
    marker = venv / ".mitt-peer.json"
    wanted = {"requirements": list(peer.requirements), "no_deps": list(peer.no_deps)}
    if marker.is_file():
        done = json.loads(marker.read_text())
        if {k: done.get(k) for k in wanted} == wanted:
            return {**done, "venv": str(venv), "python": str(venv / "bin" / "python"), "installed_now": False}
    if venv.exists():
        shutil.rmtree(venv)  # a half-made or outdated venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for command in install_commands(peer, venv, torch_wheel):
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze"], check=True, capture_output=True, text=True
    ).stdout.split()
    record = {**wanted, "install_seconds": round(time.perf_counter() - started, 1), "packages": freeze}
    marker.write_text(json.dumps(record, indent=2))
    return {**record, "venv": str(venv), "python": str(venv / "bin" / "python"), "installed_now": True}


# --------------------------------------------------------------------------- the shared split


PROTOCOLS = ("loo", "comirec")


@dataclass(frozen=True)
class BenchSplit:
    """What every side of one protocol trains and is evaluated on, in our dense item ids.

    Attributes:
        protocol: ``loo`` (``retrieval.data.splits.leave_one_out``) or ``comirec``
            (``retrieval.data.splits.comirec_split``).
        items: our external item ids; dense id ``i + 1`` is ``items[i]`` (0 = padding).
        users: external user ids, all users of the data.
        sequences: every user's whole sequence (dense ids, oldest first).
        train: the training sequences, one per training user (``train_users``).
        train_users: positions in :attr:`users` of the training sequences.
        valid_users, valid_histories, valid_targets: validation users (positions), their
            histories and their targets (one array each: one item for ``loo``, the remaining
            20% of the sequence for ``comirec``).
        test_users, test_histories, test_targets: the same for test.
    """

    protocol: str
    items: tuple[str, ...]
    users: tuple[str, ...]
    sequences: tuple[np.ndarray, ...]
    train: tuple[np.ndarray, ...]
    train_users: np.ndarray
    valid_users: np.ndarray
    valid_histories: tuple[np.ndarray, ...]
    valid_targets: tuple[np.ndarray, ...]
    test_users: np.ndarray
    test_histories: tuple[np.ndarray, ...]
    test_targets: tuple[np.ndarray, ...]

    def part(self, name: str) -> tuple[np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """``(users, histories, targets)`` of ``valid`` or ``test``."""
        if name == "valid":
            return self.valid_users, self.valid_histories, self.valid_targets
        if name == "test":
            return self.test_users, self.test_histories, self.test_targets
        raise ValueError(f"part must be 'valid' or 'test', got {name!r}")


def make_split(data: Any, protocol: str, seed: int = 42) -> BenchSplit:
    """The split of ``data`` (a ``retrieval.data.interactions.SequenceData``) under ``protocol``, made by the
    library's own functions, so that it is the one our training and evaluation use.

    ``loo``: every user trains on ``sequence[:-2]`` (the whole sequence below 3 events); users
    with 3 or more events are evaluated. ``comirec``: the training users train on their whole
    sequences; validation and test users are evaluated on (first 80%, rest).
    """
    from retrieval.data import comirec_split, leave_one_out

    sequences = tuple(np.asarray(s, np.int64) for s in data.sequences)
    if protocol == "loo":
        loo = leave_one_out(data)
        return BenchSplit(
            protocol,
            tuple(data.vocab.ids),
            tuple(data.users),
            sequences,
            tuple(loo.train),
            np.arange(len(sequences), dtype=np.int64),
            loo.valid_users,
            tuple(loo.valid_histories),
            tuple(np.asarray([t]) for t in loo.valid_targets),
            loo.test_users,
            tuple(loo.test_histories),
            tuple(np.asarray([t]) for t in loo.test_targets),
        )
    if protocol == "comirec":
        parts = comirec_split(sequences, seed)
        return BenchSplit(
            protocol,
            tuple(data.vocab.ids),
            tuple(data.users),
            sequences,
            tuple(parts.train),
            parts.train_users,
            parts.valid_users,
            tuple(parts.valid_histories),
            tuple(parts.valid_targets),
            parts.test_users,
            tuple(parts.test_histories),
            tuple(parts.test_targets),
        )
    raise ValueError(f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def split_payload(split: BenchSplit) -> dict[str, Any]:
    """The split as the runners read it (``split.json``): everything in our external ids, so a
    runner maps them to its own ids and back, and knows nothing of our dense ids."""
    items = split.items

    def external(seq: np.ndarray) -> list[str]:
        return [items[int(i) - 1] for i in seq]

    payload: dict[str, Any] = {
        "protocol": split.protocol,
        "items": list(items),
        "train_users": [split.users[u] for u in split.train_users],
        "train": [external(s) for s in split.train],
    }
    for name in ("valid", "test"):
        users, histories, targets = split.part(name)
        payload[name] = {
            "users": [split.users[u] for u in users],
            "histories": [external(h) for h in histories],
            "targets": [external(t) for t in targets],
        }
    return payload


def recbole_atomic_inter(split: BenchSplit) -> str:
    """RecBole's atomic ``.inter`` file for a ``loo`` split: every user's whole sequence with its
    position as the timestamp, so that RecBole's own leave-one-out (``eval_args.split =
    {'LS': 'valid_and_test'}``, ``order: TO``) cuts exactly our split; users with fewer than
    3 events keep only the training events (ours train on them and evaluate nothing).

    Item tokens are our external ids, user tokens our external user ids.
    """
    if split.protocol != "loo":
        raise ValueError("RecBole runs on the leave-one-out split only")
    lines = ["user_id:token\titem_id:token\ttimestamp:float"]
    evaluated = set(split.test_users.tolist())
    for u, seq in enumerate(split.sequences):
        events = seq if u in evaluated else split.train[u]
        user = split.users[u]
        lines += [f"{user}\t{split.items[int(i) - 1]}\t{t}" for t, i in enumerate(events)]
    return "\n".join(lines) + "\n"


def check_recbole_split(split: BenchSplit, reported: Mapping[str, Any], max_len: int) -> dict[str, Any]:
    """Compares the split RecBole made from the atomic file with ours.

    Args:
        split: our ``loo`` split.
        reported: the runner's ``split_check``: ``valid`` and ``test`` map user -> target,
            ``valid_histories`` and ``test_histories`` user -> its newest ``max_len`` history
            items (external ids), ``train_instances`` RecBole's training (prefix, next item) pairs.
        max_len: history length read by the models.

    Returns:
        ``{"equal": bool, "problems": [...]}``; ``equal`` when every evaluated user's targets and
        (truncated) histories match ours and RecBole trains on as many next-item pairs as our
        training sequences hold.
    """
    problems = []
    for name in ("valid", "test"):
        users, histories, targets = split.part(name)
        ids = [split.users[u] for u in users]
        ours = dict(zip(ids, (split.items[int(t[0]) - 1] for t in targets), strict=True))
        theirs = {str(k): str(v) for k, v in dict(reported.get(name, {})).items()}
        if ours != theirs:
            differ = sorted(u for u in set(ours) | set(theirs) if ours.get(u) != theirs.get(u))
            problems.append(f"{name} targets: {len(differ)} users differ (e.g. {differ[:3]})")
        ours_h = {
            u: [split.items[int(i) - 1] for i in h[-max_len:]] for u, h in zip(ids, histories, strict=True)
        }
        theirs_h = {
            str(k): [str(i) for i in v] for k, v in dict(reported.get(f"{name}_histories", {})).items()
        }
        if ours_h != theirs_h:
            differ = sorted(u for u in set(ours_h) | set(theirs_h) if ours_h.get(u) != theirs_h.get(u))
            problems.append(f"{name} histories: {len(differ)} users differ (e.g. {differ[:3]})")
    pairs = int(sum(max(len(s) - 1, 0) for s in split.train))
    if int(reported.get("train_instances", -1)) != pairs:
        problems.append(f"training pairs: ours {pairs}, RecBole {reported.get('train_instances')}")
    return {"equal": not problems, "problems": problems}


def write_split(split: BenchSplit, folder: Path) -> Path:
    """Writes ``split.json`` (and for ``loo`` RecBole's ``bench/bench.inter``) into ``folder``
    unless already there; returns the ``split.json`` path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "split.json"
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(split_payload(split)))
        tmp.replace(path)
    if split.protocol == "loo":
        atomic = folder / "recbole" / RECBOLE_DATASET / f"{RECBOLE_DATASET}.inter"
        if not atomic.is_file():
            atomic.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(recbole_atomic_inter(split))
    return path


RECBOLE_DATASET = "bench"
"""RecBole's dataset name: it reads ``<data_path>/<name>/<name>.inter``."""


# --------------------------------------------------------------------------- evaluation glue


def align_items(
    item_ids: Sequence[str], vectors: np.ndarray, items: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """A peer's item vectors, keyed by our external ids, as a table in our dense order.

    Args:
        item_ids: the external id of each row of ``vectors``.
        vectors: float ``[n, d]``.
        items: our vocabulary (dense id ``i + 1`` = ``items[i]``).

    Returns:
        ``(table, missing)``: float32 ``[len(items) + 1, d]`` with row 0 (padding) and the rows
        of items the peer has no vector for all zero, and the dense ids of those items (they
        must be kept out of every ranking: see :func:`evaluate_vectors`).

    Raises:
        ValueError: an id the vocabulary does not know, or a row count that differs from the ids.
    """
    if len(item_ids) != len(vectors):
        raise ValueError(f"{len(vectors)} item vectors for {len(item_ids)} ids")
    index = {item: i + 1 for i, item in enumerate(items)}
    unknown = [i for i in item_ids if i not in index]
    if unknown:
        raise ValueError(f"{len(unknown)} exported item ids are not in the data (e.g. {unknown[:3]})")
    table = np.zeros((len(items) + 1, vectors.shape[1]), np.float32)
    rows = np.fromiter((index[i] for i in item_ids), np.int64, len(item_ids))
    table[rows] = vectors
    covered = np.zeros(len(items) + 1, bool)
    covered[rows] = True
    missing = np.flatnonzero(~covered[1:]) + 1
    return table, missing.astype(np.int64)


LOO_KS = (10, 20, 50)
COMIREC_KS = (20, 50)


def evaluate_vectors(
    user_vectors: np.ndarray,
    item_table: np.ndarray,
    histories: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    protocol: str,
    missing: np.ndarray | None = None,
) -> dict[str, float]:
    """Our evaluator on exported vectors: exact full ranking, history excluded, best interest
    per item (``retrieval.evaluation.evaluate.exact_top_k``), then ``ranking_metrics`` (``loo``: HR, NDCG,
    Recall at 10/20/50) or ComiRec's ``comirec_metrics`` (Recall, HitRate, NDCG at 20/50).

    This is :func:`retrieval.evaluation.evaluate.evaluate_ranking` / ``evaluate_comirec`` with the user
    tower's output given instead of computed.

    Args:
        user_vectors: float ``[U, K, d]``, aligned with ``histories``.
        item_table: float ``[V, d]`` in our dense ids (row 0 = padding).
        histories: per user, dense ids excluded from its ranking.
        targets: per user, the held-out dense ids.
        protocol: ``loo`` or ``comirec``.
        missing: dense ids without a vector (:func:`align_items`): never ranked.
    """
    from retrieval.evaluation import comirec_metrics, exact_top_k, ranking_metrics

    if len(user_vectors) != len(histories):
        raise ValueError(f"{len(user_vectors)} user vectors for {len(histories)} users")
    exclude: Sequence[np.ndarray] = histories
    if missing is not None and len(missing):
        exclude = [np.union1d(h, missing) for h in histories]
    ks = LOO_KS if protocol == "loo" else COMIREC_KS
    top = exact_top_k(
        np.asarray(user_vectors, np.float32), np.asarray(item_table, np.float32), exclude, max(ks)
    )
    if protocol == "loo":
        return ranking_metrics(top, targets, ks)
    return comirec_metrics(top, targets, ks)


def validation_metrics(
    user_vectors: np.ndarray, item_table: np.ndarray, split: BenchSplit, missing: np.ndarray | None = None
) -> dict[str, float]:
    """The validation users' metrics under ``split``'s protocol, as our training computes them
    every epoch, so that both sides' best epochs are chosen by one rule (:data:`SELECT_BY`)."""
    _, histories, targets = split.part("valid")
    return evaluate_vectors(user_vectors, item_table, histories, targets, split.protocol, missing)


SELECT_BY = {"loo": "ndcg@10", "comirec": "recall@50"}
"""Per protocol, the validation metric that picks a run's best epoch: our training's early
stopping metric under that protocol (``retrieval.training.validation.make_protocol``)."""


# --------------------------------------------------------------------------- what runs


@dataclass(frozen=True)
class ModelRun:
    """One model of one side under one protocol.

    Attributes:
        side: ``ours``, ``recbole`` or ``deepmatch``.
        model: our tower name, or the peer's model name.
        protocol: ``loo`` or ``comirec``.
    """

    side: str
    model: str
    protocol: str

    @property
    def name(self) -> str:
        return f"{self.side}-{self.model}"


PAIRS = (
    ("loo", "sasrec", "recbole", "SASRec"),
    ("loo", "bert4rec", "recbole", "BERT4Rec"),
    ("comirec", "sa", "deepmatch", "ComiRec-SA"),
    ("comirec", "dr", "deepmatch", "ComiRec-DR"),
    ("comirec", "mind", "deepmatch", "MIND"),
    ("comirec", "youtubednn", "deepmatch", "YouTubeDNN"),
)
"""(protocol, our tower, peer, peer model): the counterparts compared one to one."""


def model_runs(
    peers: Sequence[str], protocols: Sequence[str], models: Sequence[str] | None, multi_interest: str
) -> list[ModelRun]:
    """Every run to do: for each protocol our towers, then the peers' models.

    ``loo`` adds ``multi_interest`` (our best multi-interest tower) to our ``sasrec`` and
    ``bert4rec``; ``models`` (names of either side) keeps only those.
    """
    runs: list[ModelRun] = []
    for protocol in protocols:
        ours = [t for p, t, _, _ in PAIRS if p == protocol]
        if protocol == "loo" and multi_interest not in ours:
            ours.append(multi_interest)
        runs += [ModelRun("ours", t, protocol) for t in ours]
        runs += [ModelRun(peer, m, protocol) for p, _, peer, m in PAIRS if p == protocol and peer in peers]
    if models:
        runs = [r for r in runs if r.model in models]
    return runs


@dataclass(frozen=True)
class Settings:
    """What fixes a run's numbers: a finished run is reused only when these are equal."""

    data: str
    max_users: int
    epochs: int | None
    """Every side's epoch budget; ``None``: per pair, our tower's (:func:`run_settings`)."""
    batch_size: int
    dim: int
    max_len: int
    seed: int
    interests: int
    negatives: int
    peer_minutes: float
    overrides: tuple[str, ...] = ()
    presets: bool = True
    """Whether our towers start from their preset for ``data`` (when it is a preset dataset)."""


# --------------------------------------------------------------------------- processes


def run_process(
    command: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> dict[str, Any]:
    """Runs ``command`` (in ``cwd``) with its output appended to ``log``.

    Returns:
        ``{"returncode", "seconds", "peak_rss_mb"}``: the peak resident memory of that process
        (``wait4``'s ``ru_maxrss``, its own, not this process's).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        process = subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ), cwd=cwd
        )
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return {
        "returncode": process.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # kilobytes on Linux
    }


def peer_environment(peer: PeerEnv) -> dict[str, str]:
    """The runner's environment: ours, without anything that would let the project or its venv
    leak in, plus the peer's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **peer.env}


def peer_command(run: ModelRun, python: str, split_dir: Path, export: Path, s: Settings) -> list[str]:
    """The runner's command line for ``run``."""
    peer = PEER_ENVS[run.side]
    command = [
        python,
        str(RUNNERS / peer.runner),
        "--model",
        run.model,
        "--split",
        str(split_dir / "split.json"),
    ]
    command += ["--out", str(export), "--epochs", str(s.epochs), "--batch-size", str(s.batch_size)]
    command += ["--dim", str(s.dim), "--max-len", str(s.max_len), "--seed", str(s.seed)]
    command += ["--max-minutes", str(s.peer_minutes)]
    if run.side == "recbole":
        command += ["--atomic", str(split_dir / "recbole")]
    if run.side == "deepmatch":
        command += ["--interests", str(s.interests), "--negatives", str(s.negatives)]
    return command


def ours_preset(model: str, s: Settings) -> str | None:
    """The preset our ``model`` starts from: ``<dataset>-<model>`` when ``s.data`` is a preset
    dataset's file (``retrieval.training.presets.dataset_at``, sliced or not) and ``s.presets``."""
    from retrieval.training import dataset_at, preset_for

    return preset_for(dataset_at(s.data), model) if s.presets else None


def ours_base_config(model: str, s: Settings) -> Config:
    """The defaults of ``retrieval.training.Config`` with our ``model``'s preset (:func:`ours_preset`)
    applied."""
    from retrieval.training import Config, apply_preset

    preset = ours_preset(model, s)
    return apply_preset(Config(), preset) if preset else Config()


def counterpart(run: ModelRun) -> str:
    """Our tower that ``run`` is compared with: its own tower, or a peer model's counterpart in
    :data:`PAIRS`."""
    if run.side == "ours":
        return run.model
    return next(t for p, t, side, m in PAIRS if (p, side, m) == (run.protocol, run.side, run.model))


def run_settings(run: ModelRun, s: Settings) -> Settings:
    """``s`` with the epoch budget of ``run`` resolved: ``s.epochs`` when given, else that of our
    counterpart tower (:func:`counterpart`): its preset's ``train.epochs`` (the budget it was
    tuned for, e.g. 39 for ``beauty-sasrec``), or the default of ``retrieval.training.config`` without a
    preset. Both sides of a pair so train for the same number of epochs."""
    if s.epochs is not None:
        return s
    return dataclasses.replace(s, epochs=ours_base_config(counterpart(run), s).train.epochs)


def ours_config(run: ModelRun, data: str, s: Settings) -> dict[str, Any]:
    """Our training configuration for ``run``: the defaults of ``retrieval.training.config``, then the
    overrides of the tower's preset (:func:`ours_preset`: its tuned losses, negatives, dropout),
    then the shared sizes and budget, ``run``'s protocol (split with the benchmark's seed, so it
    is :func:`make_split`'s), validation every epoch and early stopping's best-epoch export
    without stopping (patience = epochs), so that both sides are scored at their best validation
    epoch of the same budget; ``s.overrides`` last."""
    from retrieval.training import apply_overrides

    epochs = run_settings(run, s).epochs
    assert epochs is not None
    shared = [
        f"data.path={data}",
        f"data.protocol={run.protocol}",
        f"data.split_seed={s.seed}",
        f"model.tower={run.model}",
        f"model.dim={s.dim}",
        f"model.max_len={s.max_len}",
        f"train.epochs={epochs}",
        f"train.batch_size={s.batch_size}",
        f"train.seed={s.seed}",
        f"train.patience={max(epochs, 1)}",
        "train.eval_every=1",
    ]
    if run.model in ("sa", "dr", "mind"):
        shared.append(f"model.num_interests={s.interests}")
    return apply_overrides(ours_base_config(run.model, s), [*shared, *s.overrides]).to_dict()


def ours_worker(spec_file: Path) -> int:
    """Trains one of our towers (``python -m bench.peers --ours-worker SPEC``, its own process so
    that its memory is its own) with ``retrieval.training.train``, as ``tools/train.py`` would, and
    exports it as the runners export theirs."""
    from retrieval.training import train
    from retrieval.artifacts import encode_histories, load_model
    from retrieval.data import build_sequences, load_interactions
    from retrieval.training import Config

    spec = json.loads(spec_file.read_text())
    config = Config.from_dict(spec["config"])
    out, protocol = Path(spec["out"]), spec["protocol"]
    data = build_sequences(load_interactions(config.data.path, config.data.format))
    split = make_split(data, protocol, config.data.split_seed)
    metrics = train(config, out / "model", overwrite=True, verbose=2)

    model = load_model(out / "model")
    final = out / "export" / "final"
    final.mkdir(parents=True, exist_ok=True)
    for part in ("valid", "test"):
        _, histories, _ = split.part(part)
        np.save(final / f"{part}_users.npy", encode_histories(model, histories).astype(np.float32))
    np.save(final / "items.npy", model.item_embeddings[1:].astype(np.float32))
    (out / "export" / "item_ids.json").write_text(json.dumps(list(model.vocab.ids)))
    validation = {int(v["epoch"]): v for v in metrics["validation_per_epoch"]}
    losses = metrics["train_loss_per_epoch"]
    progress = {
        "peer": "ours",
        "model": config.model.tower,
        "train_examples": metrics["train_examples"],
        "objective": metrics["objective"],
        "hyper_parameters": config.to_dict(),
        "epochs": [
            {
                "epoch": e,
                "train_seconds": metrics["train_seconds_per_epoch"][e - 1],
                "loss": losses[e - 1] if e - 1 < len(losses) else None,
                "validation": {k: v for k, v in validation.get(e, {}).items() if k != "epoch"},
            }
            for e in range(1, metrics["epochs_trained"] + 1)
        ],
        "best_epoch": metrics["best_epoch"],
        "test_from_training": metrics["test"],
        "done": True,
    }
    (out / "export" / "progress.json").write_text(json.dumps(progress, indent=2))
    return 0


# --------------------------------------------------------------------------- one run, summarised


def epoch_folders(export: Path) -> list[tuple[int, Path]]:
    """The runner's ``epoch_NNN`` folders, by epoch."""
    found = [(int(p.name.split("_")[1]), p) for p in export.glob("epoch_*") if p.is_dir()]
    return sorted(found)


def speed(epochs: Sequence[Mapping[str, Any]], examples: int, events: int) -> dict[str, Any]:
    """Per-epoch training time: the median (robust to the first epoch's tracing and to noise),
    examples/s and training events/s at that median, and the cumulative seconds per epoch."""
    seconds = [float(e["train_seconds"]) for e in epochs]
    median = float(np.median(seconds)) if seconds else float("nan")
    return {
        "epoch_seconds": seconds,
        "median_epoch_seconds": round(median, 3),
        "cumulative_seconds": [round(float(c), 3) for c in np.cumsum(seconds)],
        "train_examples": examples,
        "train_events": events,
        "examples_per_second": round(examples / median, 1) if median > 0 else None,
        "events_per_second": round(events / median, 1) if median > 0 else None,
    }


def summarize(run: ModelRun, split: BenchSplit, export: Path, max_len: int) -> dict[str, Any]:
    """A finished run's numbers, all from our evaluator on ``split``.

    Peers: the validation metrics of every exported epoch, the best epoch by validation
    NDCG@10, and its test metrics. Ours: the validation metrics our training computed every
    epoch, and the test metrics of the exported (best) weights; for ``loo`` they are checked
    against those our training reported.
    """
    progress = json.loads((export / "progress.json").read_text())
    item_ids = json.loads((export / "item_ids.json").read_text())
    events = int(sum(len(s) for s in split.train))
    result: dict[str, Any] = {"run": run.name, **dataclasses.asdict(run)}
    result["hyper_parameters"] = progress.get("hyper_parameters")
    result["versions"] = progress.get("versions")
    if run.side == "ours":
        validation = [e["validation"] for e in progress["epochs"]]
        best_epoch = int(progress["best_epoch"] or len(validation))
        folder = export / "final"
    else:
        validation = []
        for _, folder in epoch_folders(export):
            table, missing = align_items(item_ids, np.load(folder / "items.npy"), split.items)
            validation.append(validation_metrics(np.load(folder / "valid_users.npy"), table, split, missing))
        best_epoch = 1 + int(np.argmax([v[SELECT_BY[split.protocol]] for v in validation]))
        folder = export / f"epoch_{best_epoch:03d}"
    table, missing = align_items(item_ids, np.load(folder / "items.npy"), split.items)
    _, histories, targets = split.part("test")
    result["test"] = evaluate_vectors(
        np.load(folder / "test_users.npy"), table, histories, targets, split.protocol, missing
    )
    result["items_without_vector"] = len(missing)
    result["selected_by"] = SELECT_BY[split.protocol]
    result["validation_curve"] = [round(v[SELECT_BY[split.protocol]], 6) for v in validation]
    result["best_epoch"] = best_epoch
    result["epochs_trained"] = len(progress["epochs"])
    result["stopped_by_time"] = bool(progress.get("stopped_by_time"))
    result["speed"] = speed(progress["epochs"], int(progress["train_examples"]), events)
    if run.side == "ours" and split.protocol == "loo":
        trained = progress["test_from_training"]
        gap = max(abs(trained[k] - result["test"][k]) for k in result["test"])
        result["check_exported_equals_training"] = {"max_difference": gap, "equal": gap < 1e-4}
    if run.side == "recbole":
        result["split_check"] = check_recbole_split(split, progress["split_check"], max_len)
    return result


def prune_epochs(export: Path, keep: int) -> None:
    """Deletes the exported vectors of every epoch but ``keep`` (they are summarised)."""
    for epoch, folder in epoch_folders(export):
        if epoch != keep:
            shutil.rmtree(folder)


def execute(
    run: ModelRun,
    split: BenchSplit,
    split_dir: Path,
    run_dir: Path,
    data: str,
    s: Settings,
    env: dict[str, Any],
) -> dict[str, Any]:
    """Runs one model (or reads back its finished result) and returns its summary."""
    s = run_settings(run, s)
    # Ours is also identified by its full training configuration: a preset edited since the
    # run changes it without changing the settings.
    config = ours_config(run, data, s) if run.side == "ours" else None
    done = run_dir / "result.json"
    if done.is_file():
        previous = json.loads(done.read_text())
        same = [previous.get("settings"), previous.get("config")] == json.loads(
            json.dumps([dataclasses.asdict(s), config])
        )
        if same:
            print(f"--- {run.name} ({run.protocol}): done before, read back", flush=True)
            return dict(previous)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    export = run_dir / "export"
    print(f"--- {run.name} ({run.protocol})", flush=True)
    if run.side == "ours":
        spec = {
            "config": config,
            "out": str(run_dir),
            "protocol": run.protocol,
            "seed": s.seed,
        }
        (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
        command = [sys.executable, "-m", "bench.peers", "--ours-worker", str(run_dir / "spec.json")]
        process = run_process(command, run_dir / "log.txt", {**os.environ, "PYTHONPATH": str(REPO)}, REPO)
    else:
        command = peer_command(run, env["python"], split_dir, export, s)
        # In the run folder: RecBole writes its TensorBoard logs into the working directory.
        process = run_process(command, run_dir / "log.txt", peer_environment(PEER_ENVS[run.side]), run_dir)
    if process["returncode"] != 0:
        raise RuntimeError(f"{run.name} failed (exit {process['returncode']}): see {run_dir / 'log.txt'}")
    result = summarize(run, split, export, s.max_len)
    result["process"] = process
    result["settings"] = dataclasses.asdict(s)
    result["config"] = config
    if run.side != "ours":
        prune_epochs(export, result["best_epoch"])
    done.write_text(json.dumps(result, indent=2))
    t = result["test"]
    shown = {k: round(v, 4) for k, v in t.items() if k in ("hr@10", "ndcg@10", "recall@50", "hitrate@50")}
    print(
        f"    {shown}, {result['speed']['median_epoch_seconds']} s/epoch, peak {process['peak_rss_mb']} MB",
        flush=True,
    )
    return result


# --------------------------------------------------------------------------- comparison


HEADLINE = {"loo": ("ndcg@10", "hr@10"), "comirec": ("recall@50", "hitrate@50")}
"""Per protocol, the metrics a pair is compared on (the first picks the best model)."""


def time_to_reach(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Training time each side needs to reach the peer's best validation metric (NDCG@10 under
    ``loo``, Recall@50 under ``comirec``: :data:`SELECT_BY`).

    Returns:
        ``{"target", "peer_epoch", "peer_seconds", "ours_epoch", "ours_seconds", "ratio"}``;
        ``ours_epoch`` and the ratio are ``None`` when ours never reached it.
    """
    peer_curve, ours_curve = list(peer["validation_curve"]), list(ours["validation_curve"])
    target = max(peer_curve)
    peer_epoch = 1 + peer_curve.index(target)
    peer_seconds = peer["speed"]["cumulative_seconds"][peer_epoch - 1]
    reached = next((e for e, v in enumerate(ours_curve, 1) if v >= target), None)
    ours_seconds = None if reached is None else ours["speed"]["cumulative_seconds"][reached - 1]
    return {
        "target": target,
        "peer_epoch": peer_epoch,
        "peer_seconds": peer_seconds,
        "ours_epoch": reached,
        "ours_seconds": ours_seconds,
        "ratio": None if ours_seconds is None or not peer_seconds else round(ours_seconds / peer_seconds, 4),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else round(a / b, 4)


def compare(results: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The one-to-one pairs (:data:`PAIRS`) and, per protocol, our best vs the best peer.

    Every ratio is ours / peer: above 1 is better for quality and throughput, below 1 for
    seconds and memory.
    """
    by = {(r["protocol"], r["side"], r["model"]): r for r in results}
    pairs = []
    for protocol, tower, peer_side, peer_model in PAIRS:
        ours, peer = by.get((protocol, "ours", tower)), by.get((protocol, peer_side, peer_model))
        if ours is None or peer is None:
            continue
        pairs.append(_pair(protocol, ours, peer))
    best = []
    for protocol, (key, _) in HEADLINE.items():
        ours_runs = [r for r in results if r["protocol"] == protocol and r["side"] == "ours"]
        peer_runs = [r for r in results if r["protocol"] == protocol and r["side"] != "ours"]
        if ours_runs and peer_runs:
            top_ours = max(ours_runs, key=lambda r: r["test"][key])
            top_peer = max(peer_runs, key=lambda r: r["test"][key])
            best.append(_pair(protocol, top_ours, top_peer))
    return pairs, best


def _pair(protocol: str, ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Ratios ours / peer of one pair."""
    quality = {k: _ratio(ours["test"][k], peer["test"][k]) for k in HEADLINE[protocol]}
    return {
        "protocol": protocol,
        "ours": ours["run"],
        "peer": peer["run"],
        "quality": {k: (ours["test"][k], peer["test"][k]) for k in HEADLINE[protocol]},
        "quality_ratio": quality,
        "epoch_seconds_ratio": _ratio(
            ours["speed"]["median_epoch_seconds"], peer["speed"]["median_epoch_seconds"]
        ),
        "events_per_second_ratio": _ratio(
            ours["speed"]["events_per_second"], peer["speed"]["events_per_second"]
        ),
        "time_to_peer_best": time_to_reach(ours, peer),
        "peak_rss_ratio": _ratio(ours["process"]["peak_rss_mb"], peer["process"]["peak_rss_mb"]),
    }


def _f(value: Any, digits: int = 4) -> str:
    """A table cell."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(
    meta: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    pairs: Sequence[Mapping[str, Any]],
    best: Sequence[Mapping[str, Any]],
) -> str:
    """The report: the context, one table of runs per protocol, the pairs and the best of each side."""
    sliced = f" (first {meta['max_users']} users)" if meta["max_users"] else ""
    lines = [
        f"Measured {meta['date']} at commit `{meta['commit']}` on {meta['machine']} (load average "
        f"{meta['load_start']} at the start, {meta['load_end']} at the end: other jobs inflate the times).",
        "",
        f"```bash\n{meta['command']}\n```",
        "",
        f"Data `{meta['data']}`{sliced}; every side: "
        + (
            f"{meta['epochs']} epoch(s)"
            if meta["epochs"] is not None
            else "our tower's epoch budget, its preset's (the pair's epochs column)"
        )
        + f", batch {meta['batch_size']}, d = {meta['dim']}, history "
        f"{meta['max_len']}; scored at its best validation epoch (NDCG@10 under leave-one-out, Recall@50 "
        "under the ComiRec protocol), by our evaluator (exact full "
        "ranking, history excluded) on the same split. Seconds are training only (validation excluded).",
        "",
        "Ours: "
        + (
            "each tower starts from its preset for this dataset (`retrieval/presets.py`; the sizes "
            "and budget above replace the preset's)"
            if meta.get("presets", True)
            else "the defaults of `retrieval/config.py` (`--no-presets`)"
        )
        + (f", then `--set {' '.join(meta['overrides'])}`." if meta.get("overrides") else "."),
    ]
    columns = {
        "loo": ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "hr@50", "ndcg@50"),
        "comirec": ("recall@20", "hitrate@20", "recall@50", "hitrate@50", "ndcg@50"),
    }
    titles = {"loo": "Leave-one-out, full ranking", "comirec": "ComiRec protocol (users 8:1:1, 80% history)"}
    for protocol, cols in columns.items():
        rows = [r for r in results if r["protocol"] == protocol]
        if not rows:
            continue
        lines += ["", f"### {titles[protocol]}", ""]
        head = [
            "side",
            "model",
            *cols,
            "best / epochs",
            "s / epoch",
            "examples / s",
            "events / s",
            "peak RSS MB",
        ]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            sp = r["speed"]
            cells = [r["side"], r["model"], *(_f(r["test"].get(c)) for c in cols)]
            budget = r.get("settings", {}).get("epochs")
            trained = f"{r.get('best_epoch')} / {r.get('epochs_trained')}"
            if budget and r.get("epochs_trained", budget) < budget:
                trained += f" of {budget}"
            cells += [trained, _f(sp["median_epoch_seconds"], 1)]
            cells += [_f(sp["examples_per_second"], 0), _f(sp["events_per_second"], 0)]
            cells.append(_f(r["process"]["peak_rss_mb"], 0))
            lines.append("| " + " | ".join(cells) + " |")
    if pairs or best:
        lines += ["", "### Ours / peer", ""]
        head = ["protocol", "ours", "peer", "quality (ours vs peer)", "s / epoch", "events / s",
                "time to peer's best validation metric", "peak RSS"]  # fmt: skip
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, group in (("", pairs), ("best: ", best)):
            for p in group:
                quality = ", ".join(f"{k} {_f(a)} vs {_f(b)}" for k, (a, b) in p["quality"].items())
                reach = p["time_to_peer_best"]
                target = f"{SELECT_BY[p['protocol']]} {_f(reach['target'])}"
                peer_seconds = f"{_f(reach['peer_seconds'], 0)} s"
                if reach["ours_seconds"] is None:
                    reached = f"not reached ({target} at {peer_seconds})"
                else:
                    ours_seconds = f"{_f(reach['ours_seconds'], 0)} s"
                    reached = f"{target}: {ours_seconds} vs {peer_seconds} = {_f(reach['ratio'], 2)}×"
                cells = [p["protocol"], label + p["ours"], p["peer"], quality]
                cells += [
                    f"{_f(p['epoch_seconds_ratio'], 2)}×",
                    f"{_f(p['events_per_second_ratio'], 2)}×",
                    reached,
                ]
                cells.append(f"{_f(p['peak_rss_ratio'], 2)}×")
                lines.append("| " + " | ".join(cells) + " |")
    checks = [
        f"- `{r['run']}`: RecBole's split {'equals ours' if r['split_check']['equal'] else 'DIFFERS: '}"
        + "; ".join(r["split_check"]["problems"])
        for r in results
        if "split_check" in r
    ]
    checks += [
        f"- `{r['run']}` ({r['protocol']}): exported vectors reproduce training's test metrics "
        f"(max difference {r['check_exported_equals_training']['max_difference']:.2g})"
        for r in results
        if "check_exported_equals_training" in r
    ]
    if checks:
        lines += ["", "Checks:", "", *checks]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the benchmark


def commit() -> str:
    """The checkout's commit (short hash), or ``unknown``."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """Cores and processor, e.g. ``2 cores, AMD EPYC ...``."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores, {model or platform.processor() or platform.machine()}"


def dataset_slug(data: str, max_users: int) -> str:
    """The folder name of a dataset's runs: the file's stem or the folder's name."""
    path = Path(data)
    slug = path.stem if path.suffix else path.name
    return f"{slug}-{max_users}users" if max_users else slug


def load_data(data: str, max_users: int, folder: Path) -> tuple[str, Any]:
    """The dataset every side reads, and its sequences. With ``max_users``, the first users
    (in file order) are written as an S3-Rec sequence file in ``folder`` and that file is the
    dataset (for a quick check of the pipeline on a slice)."""
    from retrieval.data import build_sequences, load_interactions

    sequences = build_sequences(load_interactions(data))
    if not max_users:
        return data, sequences
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.txt"
    lines = [
        " ".join([user, *(sequences.vocab.ids[int(i) - 1] for i in seq)])
        for user, seq in list(zip(sequences.users, sequences.sequences, strict=True))[:max_users]
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path), build_sequences(load_interactions(path))


def run_benchmark(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Installs the peers, writes the splits, runs every model (or reads it back), compares and
    writes ``results.json`` and ``results.md`` into ``args.out``."""
    load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    peers = [side for side in args.sides if side != "ours"]
    installs = {}
    for peer in peers:
        print(f"=== installing {peer} into {args.cache / peer} (once)", flush=True)
        installs[peer] = ensure_env(PEER_ENVS[peer], args.cache, find_torch_wheel(args.torch_wheel))
        installs[peer].pop("packages", None)
    runs = model_runs(peers, args.protocols, args.models, args.multi_interest)
    if "ours" not in args.sides:
        runs = [r for r in runs if r.side != "ours"]
    folder = args.out.resolve() / dataset_slug(args.data, args.max_users)  # runners run elsewhere
    source = str(Path(args.data).resolve())
    data_path, data = load_data(source, args.max_users, folder)
    settings = Settings(
        source, args.max_users, args.epochs, args.batch_size, args.dim, args.max_len, args.seed,
        args.interests, args.negatives, args.peer_minutes, tuple(args.set), not args.no_presets,
    )  # fmt: skip
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "command": "python -m bench.peers " + " ".join(argv),
        "machine": machine(),
        "load_start": load_start,
        **dataclasses.asdict(settings),
    }
    results = []
    for protocol in args.protocols:
        selected = [r for r in runs if r.protocol == protocol]
        if not selected:
            continue
        split = make_split(data, protocol, args.seed)
        split_dir = folder / protocol
        write_split(split, split_dir)
        for run in selected:
            env = installs.get(run.side, {})
            results.append(execute(run, split, split_dir, split_dir / run.name, data_path, settings, env))
            meta["load_end"] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            write_report(args.out, meta, installs, results)
    return write_report(args.out, meta, installs, results)


def write_report(
    out: Path, meta: dict[str, Any], installs: Mapping[str, Any], results: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Writes ``results.json`` and ``results.md`` (rewritten after every run)."""
    meta.setdefault("load_end", meta["load_start"])
    pairs, best = compare(results)
    report = {"meta": meta, "installs": dict(installs), "runs": list(results), "pairs": pairs, "best": best}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(meta, results, pairs, best))
    return report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--smoke`` sets the ML-100K slice, one epoch)."""
    from retrieval.training import SHARED_DATA

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--data", default=str(SHARED_DATA / "amazon-beauty" / "Beauty.txt"), help="default %(default)s"
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench-peers"), help="default %(default)s")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="peer venvs (default %(default)s)")
    p.add_argument(
        "--torch-wheel", type=Path, help="local torch 2.13.0 CPU wheel (default: found in /opt/wheels)"
    )
    p.add_argument(
        "--sides", nargs="+", default=["ours", "recbole", "deepmatch"], choices=["ours", *PEER_ENVS]
    )
    p.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    p.add_argument(
        "--models", nargs="+", help="only these models (our tower names or the peers', e.g. SASRec)"
    )
    p.add_argument(
        "--multi-interest", default="sa", help="our multi-interest tower in the loo table (%(default)s)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        help="every side's epoch budget (default: per pair, our tower's preset's, e.g. 39 for beauty-sasrec)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="every side (default %(default)s)")
    p.add_argument("--dim", type=int, default=64, help="embedding size, every side (default %(default)s)")
    p.add_argument("--max-len", type=int, default=50, help="history length, every side (default %(default)s)")
    p.add_argument("--interests", type=int, default=4, help="K of sa/dr/mind and their peers (%(default)s)")
    p.add_argument("--negatives", type=int, default=255, help="DeepMatch's sampled negatives (%(default)s)")
    p.add_argument("--seed", type=int, default=42, help="default %(default)s")
    p.add_argument("--peer-minutes", type=float, default=0.0, help="cap a peer's training time (0 = none)")
    p.add_argument("--max-users", type=int, default=0, help="only the first N users (0 = all)")
    p.add_argument(
        "--set", action="append", default=[], metavar="A.B=C", help="our config override (every tower)"
    )
    p.add_argument(
        "--no-presets",
        action="store_true",
        help="our towers from the defaults, not their preset for --data (retrieval/presets.py)",
    )
    p.add_argument("--smoke", "--quick", action="store_true", help="ML-100K, first 200 users, 1 epoch")
    p.add_argument("--install-only", action="store_true", help="install the peers' venvs and stop")
    p.add_argument("--ours-worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        given = set(argv or [])
        args.data = args.data if "--data" in given else str(SHARED_DATA / "ml-100k")
        args.epochs = args.epochs if "--epochs" in given else 1
        args.max_users = args.max_users if "--max-users" in given else 200
        args.out = args.out if "--out" in given else Path("runs/bench-peers-smoke")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.ours_worker is not None:
        return ours_worker(args.ours_worker)
    if args.install_only:
        for peer in (s for s in args.sides if s != "ours"):
            record = ensure_env(PEER_ENVS[peer], args.cache, find_torch_wheel(args.torch_wheel))
            print(f"{peer}: {record['venv']} (install {record['install_seconds']} s)")
        return 0
    started = time.perf_counter()
    run_benchmark(args, argv)
    print((args.out / "results.md").read_text())
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

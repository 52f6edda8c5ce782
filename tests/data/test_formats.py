"""Your own data: tables under any column names and timestamp units, pandas DataFrames, SASRec's
pair format and RecBole's atomic files; each read and trained on with one command (the files
each refuses, with the file and line: tests/data/test_malformed_data.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retrieval.data.columns import check_columns, parse_columns
from retrieval.data.errors import DataError
from retrieval.data.features import build_side_vocab
from retrieval.data.interactions import Interactions, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.recbole import load_recbole
from retrieval.data.s3rec import load_s3rec, load_sasrec
from retrieval.data.tables import frame_source, interactions_from_frame, load_table
from tests.helpers import run_tool


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def sequences_of(data: Interactions) -> dict[str, list[str]]:
    """User -> its items, oldest first (external ids): what training sees of the data."""
    built = build_sequences(data)
    return {u: built.vocab.external(s) for u, s in zip(built.users, built.sequences, strict=True)}


MAPPING = {"user": "uid", "item": "product_id", "timestamp": "ts"}


# --- the column mapping ----------------------------------------------------------------------


def test_parse_columns() -> None:
    assert parse_columns("user=uid, item=product_id,timestamp=ts,") == MAPPING
    assert parse_columns("") == {}
    for spec, message in [
        ("user", r"'user' is not NAME=COLUMN"),
        ("user=", r"'user=' is not NAME=COLUMN"),
        ("user=a,user=b", r"'user' is given twice"),
        ("user=a,item=a", r"column 'a' is mapped twice \(user, item\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_columns(spec)
    assert check_columns({"user": 7}) == {"user": "7"}  # --set data.columns.user=7 reads 7 as JSON
    with pytest.raises(ValueError, match="non-empty text"):
        check_columns({"user": True})


def test_a_csv_with_its_own_column_names(tmp_path: Path) -> None:
    path = write(
        tmp_path / "log.csv",
        "uid,product_id,ts,stars,name\nc1,p1,30,5,One\nc1,p2,10,4,Two\nc2,p1,20,3,\n",
    )
    data = load_table(path, {**MAPPING, "rating": "stars", "title": "name"})
    assert data.events.columns.tolist() == ["user", "item", "timestamp", "rating"]
    assert data.events["rating"].tolist() == [5, 4, 3]  # numeric, as an unmapped side column would be
    assert data.items.to_dict("records") == [{"item": "p1", "title": "One"}, {"item": "p2", "title": "Two"}]
    assert sequences_of(data) == {"c1": ["p2", "p1"], "c2": ["p1"]}
    # The mapped side column is the action feature, as a column named rating is.
    assert build_side_vocab(build_sequences(data), ("action",)).actions == ("3", "4", "5")


def test_a_column_of_our_name_that_the_mapping_replaces_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "log.csv", "user,user_id,item,timestamp\nAda,1,a,1\nBob,2,a,2\n")
    with caplog.at_level(logging.INFO, logger="retrieval.data"):
        data = load_table(path, {"user": "user_id"})
    assert data.events["user"].tolist() == ["1", "2"]
    assert any("column(s) user left out" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("log.tsv", "uid\tproduct_id\tts\nc1\tp,1\t1\nc1\tp2\t2\n"),  # by extension: commas are text
        ("log.csv", "uid\tproduct_id\tts\nc1\tp,1\t1\nc1\tp2\t2\n"),  # a .csv whose header has tabs only
        ("log.csv", "uid;product_id;ts\nc1;p,1;1\nc1;p2;2\n"),  # or semicolons only
    ],
)
def test_tab_and_semicolon_separated_tables(tmp_path: Path, name: str, text: str) -> None:
    data = load_interactions(write(tmp_path / name, text), columns=MAPPING)
    assert sequences_of(data) == {"c1": ["p,1", "p2"]}


def test_a_mapping_or_unit_is_refused_for_formats_with_fixed_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "Toy.txt", "1 10 20\n")
    with pytest.raises(DataError, match=r"Toy\.txt: a column mapping applies to tables and RecBole files"):
        load_interactions(path, columns={"user": "uid"})
    with pytest.raises(DataError, match=r"timestamp unit 'ms' applies to tables"):
        load_interactions(path, timestamp_unit="ms")
    with pytest.raises(DataError, match=r"unknown timestamp unit 'us'"):
        load_table(write(tmp_path / "log.csv", "user,item,timestamp\nu,a,1\n"), timestamp_unit="us")


# --- timestamp units -------------------------------------------------------------------------


def test_millisecond_timestamps_are_seconds_and_keep_their_order_within_a_second(tmp_path: Path) -> None:
    # c1's a and b fall in the same second, written in the wrong order: b (…900 ms) before a (…100 ms).
    path = write(
        tmp_path / "log.csv",
        "uid,product_id,ts\nc2,x,1700000000000\nc1,b,1700000000900\nc1,a,1700000000100\nc1,c,1700000005000\n",
    )
    data = load_table(path, MAPPING, "ms")
    assert data.events["timestamp"].tolist() == [1700000000, 1700000000, 1700000000, 1700000005]
    assert sequences_of(data) == {"c2": ["x"], "c1": ["a", "b", "c"]}  # users in order of appearance
    assert build_sequences(data).users == ("c2", "c1")
    # Read as seconds (the default), the same file's ties keep the rows' order instead.
    assert sequences_of(load_table(path, MAPPING))["c1"] == ["a", "b", "c"]  # a < b as integers


@pytest.mark.parametrize("in_time_order", [True, False])
def test_millisecond_rows_against_a_sort_per_user(tmp_path: Path, in_time_order: bool) -> None:
    # Oracle: each user's rows sorted by (ms, row), put back on the rows that user held.
    rng = np.random.default_rng(3)
    users = [f"u{u}" for u in rng.integers(0, 6, 300)]
    times = 1_700_000_000_000 + rng.integers(0, 5_000, 300)  # many ties within a user
    if in_time_order:
        times.sort()
    rows = [(u, f"i{n}", int(t)) for n, (u, t) in enumerate(zip(users, times, strict=True))]
    expected: list[tuple[str, str, int]] = list(rows)
    for user in set(users):
        slots = [n for n, row in enumerate(rows) if row[0] == user]
        for slot, n in zip(slots, sorted(slots, key=lambda n: (rows[n][2], n)), strict=True):
            expected[slot] = rows[n]
    text = "user,item,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows)
    events = load_table(write(tmp_path / "log.csv", text), timestamp_unit="ms").events
    assert events["item"].tolist() == [i for _, i, _ in expected]
    assert events["timestamp"].tolist() == [t // 1000 for _, _, t in expected]
    assert (events["item"].tolist() == [i for _, i, _ in rows]) == in_time_order


def test_iso_timestamps(tmp_path: Path) -> None:
    path = write(
        tmp_path / "log.csv",
        "uid,product_id,ts\n"
        "c1,b,2024-05-01T12:00:00.500Z\n"
        "c1,a,2024-05-01 14:00:00+02:00\n"  # 12:00:00 UTC: half a second before b
        "c1,c,2024-05-02\n",  # no offset: UTC
    )
    data = load_table(path, MAPPING, "iso")
    noon = 1714564800  # 2024-05-01T12:00:00Z
    assert data.events["timestamp"].tolist() == [noon, noon, noon + 12 * 3600]
    assert sequences_of(data) == {"c1": ["a", "b", "c"]}


def test_a_unit_that_looks_wrong_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ms = write(tmp_path / "ms.csv", "user,item,timestamp\nu,a,1700000000000\nu,b,1700000000001\n")
    with caplog.at_level(logging.WARNING, logger="retrieval.data"):
        load_table(ms)  # milliseconds read as seconds: the year 55,000
        load_table(write(tmp_path / "s.csv", "user,item,timestamp\nu,a,1700000000\n"), timestamp_unit="ms")
        load_table(write(tmp_path / "small.csv", "user,item,timestamp\nu,a,1\nu,b,2\n"))  # positions: fine
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    hints = [message.rpartition(", ")[2] for message in messages]
    assert hints == ["give --timestamp-unit ms", "give --timestamp-unit s"]


def test_datetime_columns_need_no_unit(tmp_path: Path) -> None:
    times = pd.to_datetime(["2024-05-01 12:00:00.5", "2024-05-01 12:00:00"], format="ISO8601")
    frame = pd.DataFrame({"user": ["u", "u"], "item": ["late", "early"], "timestamp": times})
    frame.to_parquet(tmp_path / "log.parquet")
    for unit in ("s", "ms", "iso"):
        data = load_table(tmp_path / "log.parquet", timestamp_unit=unit)
        assert data.events["timestamp"].tolist() == [1714564800, 1714564800]
        assert sequences_of(data) == {"u": ["early", "late"]}


# --- pandas DataFrames -----------------------------------------------------------------------


def test_interactions_from_a_dataframe() -> None:
    frame = pd.DataFrame(
        {"customer": [1, 1, 2], "sku": ["b", "a", "a"], "at": ["2024-05-02", "2024-05-01", "2024-05-01"]},
        index=[10, 11, 12],
    )
    before = frame.copy()
    data = interactions_from_frame(frame, {"user": "customer", "item": "sku", "timestamp": "at"}, "iso")
    assert sequences_of(data) == {"1": ["a", "b"], "2": ["a"]}
    pd.testing.assert_frame_equal(frame, before)  # the caller's frame is left as it was
    with pytest.raises(DataError, match=r"DataFrame, row 2: empty item id"):
        interactions_from_frame(pd.DataFrame({"user": ["u", "v"], "item": ["a", None], "timestamp": [1, 2]}))
    with pytest.raises(DataError, match=r"DataFrame: no column 'sku' \(data\.columns\.item\)"):
        interactions_from_frame(
            pd.DataFrame({"user": ["u"], "item": ["a"], "timestamp": [1]}), {"item": "sku"}
        )
    with pytest.raises(DataError, match=r"expected a pandas DataFrame of interactions, got list"):
        interactions_from_frame([("u", "a", 1)])  # type: ignore[arg-type]


def test_a_dataframe_is_named_by_its_shape_and_content() -> None:
    frame = pd.DataFrame({"user": ["u", "u"], "item": ["a", "b"], "timestamp": [1, 2]})
    name = frame_source(frame)
    assert name.startswith("<DataFrame 2 rows, 3 columns, sha256 ") and name.endswith(">")
    assert frame_source(frame.copy()) == name
    assert frame_source(frame.assign(timestamp=[1, 3])) != name
    assert frame_source(frame.rename(columns={"item": "sku"})) != name
    with pytest.raises(DataError, match=r"stands for a pandas DataFrame .*--data PATH"):
        load_interactions(name)


# --- SASRec's user-item pairs ------------------------------------------------------------------


def test_sasrec_pairs_users_on_many_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "ml-1m.txt", "1 10\n1 20\n2 10\n1 30\n2 40\n\n")
    for data in (load_sasrec(path), load_interactions(path), load_interactions(path, "sasrec")):
        assert sequences_of(data) == {"1": ["10", "20", "30"], "2": ["10", "40"]}
        assert data.events["timestamp"].tolist() == [0, 1, 0, 2, 1] and not data.has_time


def test_sequence_files_are_told_apart_by_their_content(tmp_path: Path) -> None:
    s3rec = write(tmp_path / "Toy.txt", "1 10 20\n2 10\n3 30 40\n")  # some lines of two fields
    assert sequences_of(load_interactions(s3rec)) == {"1": ["10", "20"], "2": ["10"], "3": ["30", "40"]}
    # Every line two fields, no user twice: S3-Rec's and SASRec's readings are the same data.
    both = write(tmp_path / "both.txt", "1 10\n2 20\n")
    assert sequences_of(load_s3rec(both)) == sequences_of(load_sasrec(both)) == {"1": ["10"], "2": ["20"]}
    # The S3-Rec loader asked explicitly still refuses a user on two lines, and says what it may be.
    pairs = write(tmp_path / "pairs.txt", "1 10\n1 20\n")
    with pytest.raises(DataError, match=r"line 2: user 1 already has a line \(line 1\); .*format sasrec"):
        load_interactions(pairs, "s3rec")


def test_a_broken_line_in_a_sasrec_file_is_named_by_detection_too(tmp_path: Path) -> None:
    path = write(tmp_path / "data.txt", "1 10\n1 20\n2 10 30\n2 40\n")
    with pytest.raises(DataError, match=r"data\.txt, line 3: expected 2 fields \(user item\)"):
        load_interactions(path)


# --- RecBole atomic files ----------------------------------------------------------------------

INTER = (
    "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "196\t242\t3\t881250949\n"
    "186\t302\t3\t891717742\n"
    "196\t302\t4\t881250950\n"
)
ITEM = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\tprice:float\n"
    "242\tKolya\t1996\tComedy\t1.5\n"
    "302\tL.A. Confidential\t1997\tCrime Film-Noir Mystery\t2\n"
    "999\tUnseen\t\t\t\n"
)


def test_recbole_inter_and_item_files(tmp_path: Path) -> None:
    write(tmp_path / "ml" / "ml.inter", INTER)
    write(tmp_path / "ml" / "ml.item", ITEM)
    for data in (load_recbole(tmp_path / "ml" / "ml.inter"), load_interactions(tmp_path / "ml")):
        assert sequences_of(data) == {"196": ["242", "302"], "186": ["302"]}
        assert data.events["rating"].tolist() == [3, 3, 4] and data.has_time
        assert data.items.to_dict("records") == [
            {"item": "242", "title": "Kolya", "attributes": ["1996", "Comedy"]},
            {
                "item": "302",
                "title": "L.A. Confidential",
                "attributes": ["1997", "Crime", "Film-Noir", "Mystery"],
            },
            {"item": "999", "title": "Unseen", "attributes": []},
        ]
    built = build_sequences(load_interactions(tmp_path / "ml" / "ml.inter"))
    assert built.item_attributes == {1: ("1996", "Comedy"), 2: ("1997", "Crime", "Film-Noir", "Mystery")}


def test_recbole_fields_of_other_names_and_no_time(tmp_path: Path) -> None:
    path = write(tmp_path / "x.inter", "session:token\tproduct:token\nA\tp2\nA\tp1\nB\tp1\n")
    data = load_recbole(path, {"user": "session", "item": "product"})
    assert sequences_of(data) == {"A": ["p2", "p1"], "B": ["p1"]}  # file order
    assert not data.has_time
    defaults = r"x\.inter, line 1: no columns 'user_id' \(data\.columns\.user\), 'item_id'"
    with pytest.raises(DataError, match=defaults):
        load_recbole(path)
    with pytest.raises(DataError, match=r"x\.inter, line 1: no field 'stars' \(data\.columns\.rating\)"):
        load_recbole(path, {"user": "session", "item": "product", "rating": "stars"})


def test_recbole_round_trip_with_the_peers_benchmark_writer(synthetic_csv: Path, tmp_path: Path) -> None:
    """The peers benchmark writes RecBole's .inter of a leave-one-out split (bench/peers/splits.py):
    read back, it holds every user's sequence as ours."""
    from bench.peers.splits import RECBOLE_DATASET, make_split, write_split

    ours = build_sequences(load_interactions(synthetic_csv))
    write_split(make_split(ours, "loo"), tmp_path)
    folder = tmp_path / "recbole" / RECBOLE_DATASET
    theirs = sequences_of(load_interactions(folder))
    assert theirs == {u: ours.vocab.external(s) for u, s in zip(ours.users, ours.sequences, strict=True)}


def test_ml100k_as_sasrec_pairs_and_recbole_atomic_files(shared_data: Path, tmp_path: Path) -> None:
    """ML-100K written in SASRec's format (its data/ml-1m.txt's preprocessing: every user's items
    by time) and RecBole's ml-100k.inter read back as the MovieLens folder's sequences."""
    movielens = load_interactions(shared_data / "ml-100k")
    expected = sequences_of(movielens)
    pairs = [f"{u} {i}" for u, items in expected.items() for i in items]
    assert sequences_of(load_interactions(write(tmp_path / "ml-100k.txt", "\n".join(pairs)))) == expected
    events = movielens.events
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    inter += [
        f"{u}\t{i}\t{r}\t{t}" for u, i, t, r in events[["user", "item", "timestamp", "rating"]].to_numpy()
    ]
    write(tmp_path / "ml-100k" / "ml-100k.inter", "\n".join(inter) + "\n")
    assert sequences_of(load_interactions(tmp_path / "ml-100k")) == expected


# --- the prepared writer reads them too --------------------------------------------------------


def test_prepare_reads_a_mapped_table(tmp_path: Path) -> None:
    from retrieval.data.prepared.writer import prepare

    path = write(tmp_path / "log.csv", "uid,product_id,ts\nc1,a,1000\nc1,b,2000\nc1,c,3000\nc2,a,1500\n")
    summary = prepare(path, tmp_path / "prepared", columns=MAPPING, timestamp_unit="ms", progress=False)
    assert (summary.users, summary.items, summary.events, summary.evaluated_users) == (2, 3, 4, 1)
    with pytest.raises(DataError, match=r"not read out of core \(format dataset\) yet"):
        prepare(tmp_path, tmp_path / "other", columns=MAPPING, progress=False)


# --- each trains with one command ----------------------------------------------------------------

TINY = ["--model", "youtubednn", "--epochs", "1", "--dim", "8", "--max-len", "8", "--negatives", "10"]
TINY += ["--quiet"]


def shop_log(path: Path) -> Path:
    """60 customers over 40 products in 4 shelves, times in milliseconds, own column names."""
    rng = np.random.default_rng(3)
    rows = ["uid,product_id,ts,stars"]
    for customer in range(60):
        shelf, t = int(rng.integers(4)), 1_700_000_000_000 + customer
        for step in range(int(rng.integers(5, 12))):
            rows.append(f"c{customer},p{shelf * 10 + step % 10},{t},{rng.integers(1, 6)}")
            t += int(rng.integers(1, 600_000))
    return write(path, "\n".join(rows) + "\n")


def test_a_csv_with_other_column_names_trains_with_one_command(tmp_path: Path) -> None:
    csv = shop_log(tmp_path / "shop.csv")
    mapping = ["data.columns.user=uid", "data.columns.item=product_id", "data.columns.timestamp=ts"]
    sets = [
        arg for s in [*mapping, "data.columns.rating=stars", "data.timestamp_unit=ms"] for arg in ("--set", s)
    ]
    assert run_tool("train", "--data", str(csv), *sets, "--out", str(tmp_path / "m"), *TINY) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())["data"]
    assert config["columns"] == {"user": "uid", "item": "product_id", "timestamp": "ts", "rating": "stars"}
    assert config["timestamp_unit"] == "ms"
    assert set(json.loads((tmp_path / "m" / "vocab.json").read_text())["ids"]) <= {f"p{i}" for i in range(40)}


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_the_columns_flag_and_the_tools_after_training_read_the_table_as_training_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--columns`` is the mapping in one flag; evaluate and build-index read the same mapped table
    with the model's own mapping and unit (from its config.json), with no flag of their own."""
    csv = shop_log(tmp_path / "shop.csv")
    model = tmp_path / "m"
    flags = ["--columns", "user=uid,item=product_id,timestamp=ts,rating=stars", "--timestamp-unit", "ms"]
    assert run_tool("train", "--data", str(csv), *flags, "--out", str(model), *TINY) == 0
    config = json.loads((model / "config.json").read_text())["data"]
    assert config["columns"] == {"user": "uid", "item": "product_id", "timestamp": "ts", "rating": "stars"}
    assert config["timestamp_unit"] == "ms"
    capsys.readouterr()
    assert run_tool("evaluate", "--model", str(model), "--data", str(csv)) == 0
    evaluated = json.loads(capsys.readouterr().out)
    trained = json.loads((model / "metrics.json").read_text())["test"]  # the same split and model
    assert evaluated["users"] > 0
    assert evaluated["ndcg@10"] == pytest.approx(trained["ndcg@10"]) and evaluated["hr@10"] == pytest.approx(
        trained["hr@10"]
    )
    index = tmp_path / "index"
    assert (
        run_tool("build_index", "--model", str(model), "--out", str(index), "--data", str(csv), "--k", "5")
        == 0
    )
    assert json.loads((index / "manifest.json").read_text())["measured"]["query_source"] == "users"


def test_a_missing_mapped_column_fails_the_command_with_the_file_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = shop_log(tmp_path / "shop.csv")
    code = run_tool(
        "train", "--data", str(csv), "--set", "data.columns.user=customer", "--out", str(tmp_path / "m")
    )
    assert code == 2
    assert "shop.csv, line 1: no column 'customer' (data.columns.user)" in capsys.readouterr().err


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_a_sasrec_file_trains_with_one_command(synthetic_csv: Path, tmp_path: Path) -> None:
    ours = sequences_of(load_interactions(synthetic_csv))
    pairs = write(tmp_path / "pairs.txt", "".join(f"{u} {i}\n" for u, items in ours.items() for i in items))
    pairs.write_text(pairs.read_text().replace("u", "").replace("i", ""))  # SASRec's ids are numbers
    assert run_tool("train", "--data", str(pairs), "--out", str(tmp_path / "m"), *TINY) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["data"]["format"] is None  # detected


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_a_recbole_inter_file_trains_with_one_command(synthetic_csv: Path, tmp_path: Path) -> None:
    events = load_interactions(synthetic_csv).events
    inter = ["user_id:token\titem_id:token\ttimestamp:float"]
    inter += [f"{u}\t{i}\t{t}" for u, i, t in events[["user", "item", "timestamp"]].to_numpy()]
    path = write(tmp_path / "shop" / "shop.inter", "\n".join(inter) + "\n")
    items = sorted(set(events["item"]))
    write(
        path.with_suffix(".item"),
        "item_id:token\tshelf:token\n" + "".join(f"{i}\ts{i[1:2]}\n" for i in items),
    )
    assert run_tool("train", "--data", str(path), "--out", str(tmp_path / "m"), *TINY) == 0
    attributes = json.loads((tmp_path / "m" / "item_attributes.json").read_text())
    assert attributes["i12"] == ["s1"]


@pytest.mark.slow  # a second end-to-end run of a path the fast tier covers
def test_train_from_python_on_a_dataframe(
    synthetic_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval.config import apply_overrides
    from retrieval.training.config import Config
    from retrieval.training.run import TrainResult, train

    frame = pd.read_csv(synthetic_csv).rename(columns={"user": "who", "item": "what", "timestamp": "when"})
    frame["when"] = pd.to_datetime(frame["when"], unit="s")
    config = apply_overrides(
        Config(),
        [
            "model.tower=youtubednn",
            "model.dim=8",
            "model.max_len=8",
            "train.num_negatives=10",
            "train.epochs=1",
        ],
    )
    config = apply_overrides(
        config, ["data.columns.user=who", "data.columns.item=what", "data.columns.timestamp=when"]
    )
    result = train(config, tmp_path / "m", verbose=0, data=frame)
    assert isinstance(result, TrainResult) and result.test
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["data"]
    assert saved["path"] == frame_source(frame)  # what trained it, not a path to read again
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["data"] == frame_source(frame)
    # Its config.json given again cannot silently read a file: it asks for the data.
    code = run_tool(
        "train", "--config", str(tmp_path / "m" / "config.json"), "--out", str(tmp_path / "again")
    )
    assert code == 2 and "stands for a pandas DataFrame" in capsys.readouterr().err
    # A path given to train() replaces config.data.path, and is saved as such.
    path = tmp_path / "mapped.csv"
    frame.assign(when=pd.read_csv(synthetic_csv)["timestamp"]).to_csv(path, index=False)
    train(config, tmp_path / "p", verbose=0, data=path)
    assert json.loads((tmp_path / "p" / "config.json").read_text())["data"]["path"] == str(path)

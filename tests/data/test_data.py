"""Tests for retrieval.data: loaders, sequences, the leave-one-out split, training examples and the
download of MovieLens-100K."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import socket
import threading
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from retrieval.data import movielens
from retrieval.data.datasets import DATA_ROOT_ENV, dataset_at, dataset_path
from retrieval.data.errors import DataError
from retrieval.data.interactions import SequenceData, build_sequences
from retrieval.data.loaders import load_interactions
from retrieval.data.movielens import download_movielens_100k, load_movielens, verify_movielens_100k
from retrieval.data.s3rec import load_s3rec
from retrieval.data.splits import leave_one_out
from retrieval.data.tables import load_table
from retrieval.data.vocab import PAD, ItemVocab
from tests.data.helpers import write_files


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


def records(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict("records")


# --- tiny hand-written datasets -------------------------------------------------------------


ML100K = {
    "u.data": "1\t2\t4\t881250949\n1\t1\t5\t874965758\n2\t1\t3\t891717742\n\n",
    "u.genre": "unknown|0\nAction|1\nComedy|2\n\n",
    "u.item": "1|Toy Story (1995)|01-Jan-1995||http://x|0|0|1\n"
    "2|Café au lait (1993)|01-Jan-1993||http://y|0|1|1\n"
    "3|Unwatched (1990)|01-Jan-1990||http://z|1|0|0\n",
}
"""Unsorted ratings, and a blank line at the end like the official u.genre."""
ML1M = {
    "ratings.dat": "1::1193::5::978300760\r\n1::661::3::978302109\r\n2::1193::4::978298413\r\n",
    "movies.dat": "661::James and the Giant Peach (1996)::Animation|Children's|Musical\n"
    "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n"
    "2::Señor (1995)::\n",
}


@pytest.fixture
def ml100k(tmp_path: Path) -> Path:
    return write_files(tmp_path / "ml-100k", ML100K)


@pytest.fixture
def ml1m(tmp_path: Path) -> Path:
    return write_files(tmp_path / "ml-1m", ML1M)


@pytest.fixture
def s3rec(tmp_path: Path) -> Path:
    attributes = {"1": [1, 2], "2": [2], "3": [3], "4": [], "5": [1], "9": [4]}
    files = {"Toy.txt": "1 3 1 2\n2 2 4\n3 1 5 5\n", "Toy_item2attributes.json": json.dumps(attributes)}
    return write_files(tmp_path, files) / "Toy.txt"


# --- loaders --------------------------------------------------------------------------------


def test_load_movielens_100k(ml100k: Path) -> None:
    data = load_movielens(ml100k)
    assert records(data.events) == [
        {"user": "1", "item": "2", "timestamp": 881250949, "rating": 4},
        {"user": "1", "item": "1", "timestamp": 874965758, "rating": 5},
        {"user": "2", "item": "1", "timestamp": 891717742, "rating": 3},
    ]
    assert data.events["timestamp"].dtype == np.int64
    assert records(data.items) == [
        {"item": "1", "title": "Toy Story (1995)", "attributes": ["Comedy"]},
        {"item": "2", "title": "Café au lait (1993)", "attributes": ["Action", "Comedy"]},
        {"item": "3", "title": "Unwatched (1990)", "attributes": ["unknown"]},
    ]
    assert data.source == str(ml100k)
    # The ratings file itself is accepted too.
    assert records(load_movielens(ml100k / "u.data").events) == records(data.events)


def test_load_movielens_100k_without_u_genre_uses_the_official_genre_names(ml100k: Path) -> None:
    (ml100k / "u.genre").unlink()
    flags = ["0"] * 19
    flags[1] = flags[18] = "1"  # Action, Western
    write(ml100k / "u.item", "|".join(["1", "Toy Story (1995)", "", "", "http://x", *flags]) + "\n")
    assert records(load_movielens(ml100k).items) == [
        {"item": "1", "title": "Toy Story (1995)", "attributes": ["Action", "Western"]}
    ]


def test_load_movielens_without_item_file_lists_the_rated_items(ml100k: Path) -> None:
    (ml100k / "u.item").unlink()
    assert records(load_movielens(ml100k).items) == [{"item": "2"}, {"item": "1"}]


def test_load_movielens_1m(ml1m: Path) -> None:
    for path in (ml1m, ml1m / "ratings.dat"):
        data = load_movielens(path)
        assert records(data.events) == [
            {"user": "1", "item": "1193", "timestamp": 978300760, "rating": 5},
            {"user": "1", "item": "661", "timestamp": 978302109, "rating": 3},
            {"user": "2", "item": "1193", "timestamp": 978298413, "rating": 4},
        ]
    assert records(data.items) == [
        {
            "item": "661",
            "title": "James and the Giant Peach (1996)",
            "attributes": ["Animation", "Children's", "Musical"],
        },
        {"item": "1193", "title": "One Flew Over the Cuckoo's Nest (1975)", "attributes": ["Drama"]},
        {"item": "2", "title": "Señor (1995)", "attributes": []},
    ]


def test_load_s3rec_with_attributes_beside_it(s3rec: Path) -> None:
    data = load_s3rec(s3rec)
    assert data.events["user"].tolist() == ["1", "1", "1", "2", "2", "3", "3", "3"]
    assert data.events["item"].tolist() == ["3", "1", "2", "2", "4", "1", "5", "5"]
    assert data.events["timestamp"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]  # position in the line
    assert data.events["timestamp"].dtype == np.int64
    # Items seen in the sequences first, then those only in the json.
    assert records(data.items) == [
        {"item": "3", "attributes": ["3"]},
        {"item": "1", "attributes": ["1", "2"]},
        {"item": "2", "attributes": ["2"]},
        {"item": "4", "attributes": []},
        {"item": "5", "attributes": ["1"]},
        {"item": "9", "attributes": ["4"]},
    ]


def test_load_s3rec_attributes_given_or_absent(s3rec: Path, tmp_path: Path) -> None:
    other = write(tmp_path / "other.json", json.dumps({"3": [7, 7], "1": ["x"]}))
    items = load_s3rec(s3rec, attributes=other).items
    assert items["attributes"].tolist() == [["7", "7"], ["x"], None, None, None]
    (tmp_path / "Toy_item2attributes.json").unlink()
    assert records(load_s3rec(s3rec).items) == [{"item": i} for i in ["3", "1", "2", "4", "5"]]


def test_load_table_csv(tmp_path: Path) -> None:
    path = write(
        tmp_path / "log.csv",
        "user,item,timestamp,rating,title,device\n"
        'u1,A,20,4.5,"Alpha, the first",phone\n'
        "\n"
        "u2,B,10,3,,web\n"
        "u1,B,30,5,Beta,phone\n",
    )
    data = load_table(path)
    assert records(data.events) == [
        {"user": "u1", "item": "A", "timestamp": 20, "rating": 4.5, "device": "phone"},
        {"user": "u2", "item": "B", "timestamp": 10, "rating": 3.0, "device": "web"},
        {"user": "u1", "item": "B", "timestamp": 30, "rating": 5.0, "device": "phone"},
    ]
    assert data.events["timestamp"].dtype == np.int64
    # The first non-empty title of each item.
    assert records(data.items) == [{"item": "A", "title": "Alpha, the first"}, {"item": "B", "title": "Beta"}]


def test_load_table_parquet(tmp_path: Path) -> None:
    path = tmp_path / "log.parquet"
    frame = pd.DataFrame({"user": [7, 8], "item": [100, 200], "timestamp": [5, 6], "weight": [0.5, 1.0]})
    frame.to_parquet(path)
    data = load_table(path)
    assert records(data.events) == [
        {"user": "7", "item": "100", "timestamp": 5, "weight": 0.5},
        {"user": "8", "item": "200", "timestamp": 6, "weight": 1.0},
    ]
    assert records(data.items) == [{"item": "100"}, {"item": "200"}]


def test_load_table_parquet_datetimes_and_whole_float_ids(tmp_path: Path) -> None:
    path = tmp_path / "log.parquet"
    frame = pd.DataFrame(
        {
            "user": [1.0, 2.0],  # an integer column with a gap elsewhere comes back as float
            "item": [10, 20],
            "timestamp": pd.to_datetime(["1970-01-01 00:01:40", "2020-01-01 00:00:00"]),  # naive: UTC
        }
    )
    frame.to_parquet(path)
    data = load_table(path)
    assert records(data.events) == [
        {"user": "1", "item": "10", "timestamp": 100},
        {"user": "2", "item": "20", "timestamp": 1577836800},
    ]
    aware = frame.assign(timestamp=pd.to_datetime(["2020-01-01 01:00"]).tz_localize("Europe/Paris").repeat(2))
    aware.to_parquet(path)
    assert load_table(path).events["timestamp"].tolist() == [1577836800, 1577836800]


def test_load_interactions_detects_the_format(ml100k: Path, ml1m: Path, s3rec: Path, tmp_path: Path) -> None:
    csv_path = write(tmp_path / "log.csv", "user,item,timestamp\nu,i,1\n")
    assert load_interactions(ml100k).events.columns.tolist() == ["user", "item", "timestamp", "rating"]
    assert load_interactions(ml1m / "ratings.dat").events["item"].tolist() == ["1193", "661", "1193"]
    assert "attributes" in load_interactions(s3rec).items.columns
    assert load_interactions(csv_path).events["user"].tolist() == ["u"]
    # format= overrides the extension.
    other = write(tmp_path / "seqs.dat", "1 5 6\n")
    assert load_interactions(other, format="s3rec").events["item"].tolist() == ["5", "6"]


def test_load_interactions_unknown_format(tmp_path: Path) -> None:
    path = write(tmp_path / "log.json", "{}")
    with pytest.raises(DataError, match=r"log\.json: cannot tell the data format"):
        load_interactions(path)
    with pytest.raises(DataError, match="unknown data format 'xml'"):
        load_interactions(path, format="xml")
    with pytest.raises(DataError, match=r"nothing: no such file or folder"):
        load_interactions(tmp_path / "nothing")
    with pytest.raises(DataError, match=r"no u\.data or ratings\.dat"):
        load_movielens(tmp_path)


# --- sequences ------------------------------------------------------------------------------


def test_build_sequences_sorts_by_time_and_keeps_file_order_on_ties(tmp_path: Path) -> None:
    path = write(
        tmp_path / "log.csv",
        "user,item,timestamp\nu1,a,30\nu2,b,10\nu1,c,10\nu2,a,20\nu1,b,10\nu3,c,5\n",
    )
    data = build_sequences(load_table(path))
    # Sorted (stable): (u3,c,5) (u2,b,10) (u1,c,10) (u1,b,10) (u2,a,20) (u1,a,30) -> c=1, b=2, a=3.
    assert data.vocab.ids == ("c", "b", "a")
    assert data.users == ("u1", "u2", "u3")  # file order
    assert [s.tolist() for s in data.sequences] == [[1, 2, 3], [2, 3], [1]]
    assert all(s.dtype == np.int64 for s in data.sequences)
    assert data.vocab.titles is None
    assert data.item_attributes is None


def test_build_sequences_ties_keep_file_order_in_long_sequences(tmp_path: Path) -> None:
    # 80 events where an unstable sort reorders equal timestamps (numpy's default does, here).
    times = [5, 3] * 40
    rows = "".join(f"u,i{n},{t}\n" for n, t in enumerate(times))
    data = build_sequences(load_table(write(tmp_path / "log.csv", "user,item,timestamp\n" + rows)))
    expected = [f"i{n}" for n in range(1, 80, 2)] + [f"i{n}" for n in range(0, 80, 2)]
    assert data.vocab.external(data.sequences[0]) == expected


def test_build_sequences_carries_titles_and_attributes(ml100k: Path) -> None:
    data = build_sequences(load_movielens(ml100k))
    # Item 3 is listed in u.item but never rated: not in the vocabulary.
    assert data.vocab.ids == ("1", "2")
    assert data.vocab.lookup(["1", "2", "3"]).tolist() == [1, 2, PAD]
    assert data.vocab.num_embeddings == 3  # padding row 0
    assert data.vocab.titles == ("Toy Story (1995)", "Café au lait (1993)")
    assert data.item_attributes == {1: ("Comedy",), 2: ("Action", "Comedy")}
    assert data.users == ("1", "2")
    assert [s.tolist() for s in data.sequences] == [[1, 2], [1]]


def test_build_sequences_s3rec(s3rec: Path) -> None:
    data = build_sequences(load_s3rec(s3rec))
    # By position: first items 3, 2, 1, then 1, 4, 5, then 2, 5 -> '3'=1, '2'=2, '1'=3, '4'=4, '5'=5.
    assert data.vocab.ids == ("3", "2", "1", "4", "5")
    assert [s.tolist() for s in data.sequences] == [[1, 3, 2], [2, 4], [3, 5, 5]]
    # Item 9 has attributes but no events.
    assert data.item_attributes == {1: ("3",), 2: ("2",), 3: ("1", "2"), 4: (), 5: ("1",)}


def test_build_sequences_titles_from_a_table(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", "user,item,timestamp,title\nu,a,1,Apple\nu,b,2,\n")
    vocab = build_sequences(load_table(path)).vocab
    assert vocab.titles == ("Apple", "b")  # no title: the id


# --- leave-one-out split and training examples ----------------------------------------------


def sequence_data(*sequences: list[int]) -> SequenceData:
    vocab = ItemVocab.from_ids(str(i) for i in range(1, 7))
    users = tuple(f"u{i}" for i in range(len(sequences)))
    return SequenceData(vocab, users, tuple(np.array(s, np.int64) for s in sequences), None)


def test_leave_one_out_hand_worked() -> None:
    split = leave_one_out(sequence_data([1, 2, 3, 4, 5], [6, 1], [2, 4, 6], [3]))
    assert [t.tolist() for t in split.train] == [[1, 2, 3], [6, 1], [2], [3]]
    # Users 1 and 3 have < 3 items: no valid/test example.
    assert split.valid_users.tolist() == [0, 2]
    assert [h.tolist() for h in split.valid_histories] == [[1, 2, 3], [2]]
    assert split.valid_targets.tolist() == [4, 4]
    assert split.test_users.tolist() == [0, 2]
    assert [h.tolist() for h in split.test_histories] == [[1, 2, 3, 4], [2, 4]]
    assert split.test_targets.tolist() == [5, 6]


def test_refitted_leave_one_out_trains_on_the_validation_event() -> None:
    split = leave_one_out(sequence_data([1, 2, 3, 4, 5], [6, 1], [2, 4, 6], [3]), refit=True)
    assert [t.tolist() for t in split.train] == [[1, 2, 3, 4], [6, 1], [2, 4], [3]]
    assert split.valid_users.shape == split.valid_targets.shape == (0,) and split.valid_histories == ()
    # The same test as without refit: the last event, from every event before it.
    assert split.test_users.tolist() == [0, 2]
    assert [h.tolist() for h in split.test_histories] == [[1, 2, 3, 4], [2, 4]]
    assert split.test_targets.tolist() == [5, 6]


def test_leave_one_out_without_evaluable_users() -> None:
    split = leave_one_out(sequence_data([1, 2], [3]))
    assert [t.tolist() for t in split.train] == [[1, 2], [3]]
    assert split.valid_users.shape == split.test_users.shape == (0,)
    assert split.valid_targets.shape == split.test_targets.shape == (0,)
    assert split.valid_histories == split.test_histories == ()


# --- errors: the file, the line and what is wrong -------------------------------------------


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"Toy\.txt: no such file"):
        load_s3rec(tmp_path / "Toy.txt")
    with pytest.raises(DataError, match=r"log\.csv: no such file"):
        load_table(tmp_path / "log.csv")
    with pytest.raises(DataError, match=r"log\.parquet: no such file"):
        load_table(tmp_path / "log.parquet")
    with pytest.raises(DataError, match=r"ml-100k: no such file or folder"):
        load_movielens(tmp_path / "ml-100k")
    write(tmp_path / "Toy.txt", "1 2\n")
    with pytest.raises(DataError, match=r"missing\.json: no such file"):
        load_s3rec(tmp_path / "Toy.txt", attributes=tmp_path / "missing.json")


def test_verify_movielens_100k_rejects_other_files(tmp_path: Path) -> None:
    write(tmp_path / "u.item", "1|Toy Story|x||url|0\n")
    write(tmp_path / "u.user", "1|24|M|technician|85711\n")
    with pytest.raises(DataError, match=r"u\.item: SHA-256 [0-9a-f]{64} differs from the official 5538"):
        verify_movielens_100k(tmp_path)
    (tmp_path / "u.item").unlink()
    with pytest.raises(DataError, match=r"u\.item: missing"):
        verify_movielens_100k(tmp_path)


# --- the real datasets in ../shared/data ----------------------------------------------------


def test_movielens_100k_real(shared_data: Path) -> None:
    data = load_interactions(shared_data / "ml-100k")
    sequences = build_sequences(data)
    assert len(data.events) == 100_000
    assert len(sequences.users) == 943
    assert len(sequences.vocab) == 1682
    assert sum(len(s) for s in sequences.sequences) == 100_000
    assert sequences.item_attributes is not None and len(sequences.item_attributes) == 1682
    assert sequences.vocab.title(int(sequences.vocab.lookup(["1"])[0])) == "Toy Story (1995)"
    split = leave_one_out(sequences)
    assert len(split.test_targets) == 943  # every ML-100K user has >= 20 ratings


def test_movielens_100k_real_is_chronological(shared_data: Path) -> None:
    data = load_interactions(shared_data / "ml-100k")
    sequences = build_sequences(data)
    when = {(u, i): t for u, i, t in data.events[["user", "item", "timestamp"]].itertuples(index=False)}
    user = sequences.users[0]
    times = [when[(user, item)] for item in sequences.vocab.external(sequences.sequences[0])]
    assert times == sorted(times) and len(times) > 100


def test_beauty_real(shared_data: Path) -> None:
    data = load_interactions(shared_data / "amazon-beauty" / "Beauty.txt")
    sequences = build_sequences(data)
    assert len(data.events) == 198_502
    assert len(sequences.users) == 22_363
    assert len(sequences.vocab) == 12_101
    assert sequences.item_attributes is not None
    assert set(sequences.item_attributes) == set(range(1, 12_102))  # every item
    assert all(sequences.item_attributes.values())
    assert min(len(s) for s in sequences.sequences) >= 5


def test_verify_movielens_100k_real(shared_data: Path, tmp_path: Path) -> None:
    verify_movielens_100k(shared_data / "ml-100k")
    for name in ("u.item", "u.user"):
        (tmp_path / name).write_bytes((shared_data / "ml-100k" / name).read_bytes())
    lines = (shared_data / "ml-100k" / "u.data").read_bytes().splitlines(keepends=True)
    (tmp_path / "u.data").write_bytes(b"".join(lines[:-1]))
    with pytest.raises(DataError, match=r"u\.data: 99999 lines, the official file has 100000"):
        verify_movielens_100k(tmp_path)


def test_the_data_root_finds_ml100k_through_a_symlink(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data root is taken as given (``$MITT_DATA`` here, a symlink): paths under it are not
    resolved, and a dataset is recognised by any path to the same folder."""
    link = tmp_path / "root"
    link.symlink_to(shared_data, target_is_directory=True)
    monkeypatch.setenv(DATA_ROOT_ENV, str(link))
    found = dataset_path("ml100k")
    assert found == link / "ml-100k"
    assert found.resolve() == (shared_data / "ml-100k").resolve()
    assert dataset_at(shared_data / "ml-100k") == dataset_at(found) == "ml100k"
    verify_movielens_100k(found)


def test_vocab_maps_ids_both_ways_and_refuses_indices_outside_it() -> None:
    vocab = ItemVocab.from_ids(["a", "b", "c", "a"])
    np.testing.assert_array_equal(vocab.lookup(["c", "zz", "a"]), [3, PAD, 1])
    assert vocab.external(np.array([3, 1, 2])) == ["c", "a", "b"]
    assert vocab.external([]) == []
    for bad in (0, 4, -1):  # 0 is padding, not an item
        with pytest.raises(IndexError, match=str(bad)):
            vocab.external([1, bad])


# --- the download of MovieLens-100K: no network, retries, resumption, a wrong archive ------------


def fake_ml100k_archive(events: int = 5) -> bytes:
    """A zip laid out as GroupLens' ml-100k.zip, with other files (not the official release)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("ml-100k/u.data", "".join(f"1\t{i}\t5\t{880000000 + i}\n" for i in range(1, events + 1)))
        zf.writestr("ml-100k/u.item", "1|Toy Story (1995)|x||url|0\n")
        zf.writestr("ml-100k/u.user", "1|24|M|technician|85711\n")
    return buffer.getvalue()


def accept_as_official(monkeypatch: pytest.MonkeyPatch, archive: bytes) -> None:
    """Makes the verification take ``archive``'s files for the official ones."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        sums = {n: hashlib.sha256(zf.read(f"ml-100k/{n}")).hexdigest() for n in ("u.item", "u.user")}
        lines = zf.read("ml-100k/u.data").count(b"\n")
    monkeypatch.setattr(movielens, "ML100K_SHA256", sums)
    monkeypatch.setattr(movielens, "ML100K_EVENTS", lines)


class ArchiveServer:
    """An HTTP server on a free local port serving ``payload`` at ``/ml-100k.zip``.

    Attributes:
        ranges: the ``Range`` header of every request (None when absent), in order.
        cut: the first this many responses stop halfway through the body (the connection drops).
        ranged: whether ``Range`` requests are answered with ``206`` and the rest (else ``200``
            and the whole file, as servers that ignore ranges do).
        status: an error status every request gets instead (0: none).
    """

    def __init__(self, payload: bytes, cut: int = 0, ranged: bool = True, status: int = 0) -> None:
        self.payload, self.cut, self.ranged, self.status = payload, cut, ranged, status
        self.ranges: list[str | None] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.ranges.append(self.headers.get("Range"))
                if server.status:
                    self.send_error(server.status)
                    return
                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if match and server.ranged:
                    start = int(match.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(payload) - 1}/{len(payload)}")
                else:
                    self.send_response(200)
                body = server.payload[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.cut > 0:
                    server.cut -= 1
                    body = body[: len(body) // 2]
                    self.close_connection = True
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/ml-100k.zip"
        payload = self.payload
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ArchiveServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/ml-100k.zip"  # nothing listens once closed


def test_a_download_without_network_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    url = closed_port_url()
    with pytest.raises(DataError) as error:
        download_movielens_100k(tmp_path, url, attempts=2, backoff=0, progress=False)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"cannot download MovieLens-100K from {url}: ")
    assert "(after 2 attempts)" in message
    assert (
        f"put the official ml-100k files (u.data, u.item, u.user, ...) in {tmp_path / 'ml-100k'}" in message
    )
    assert "--data PATH" in message
    assert all(digest in message for digest in movielens.ML100K_SHA256.values())
    assert not (tmp_path / "ml-100k").exists()


def test_urllib_failures_are_data_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match=r"Temporary failure in name resolution \(after 3 attempts\); put"):
        download_movielens_100k(tmp_path, attempts=3, backoff=0, progress=False)


def test_a_dropped_download_is_resumed_from_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = fake_ml100k_archive()
    accept_as_official(monkeypatch, archive)
    with ArchiveServer(archive, cut=1) as server:
        folder = download_movielens_100k(tmp_path, server.url, attempts=2, backoff=0, progress=False)
    assert server.ranges == [None, f"bytes={len(archive) // 2}-"]
    assert folder == tmp_path / "ml-100k" and (folder / "u.data").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml-100k"]  # no partial file left
    assert download_movielens_100k(tmp_path, server.url, progress=False) == folder  # verified, not fetched
    assert len(server.ranges) == 2


def test_a_later_run_continues_a_failed_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = fake_ml100k_archive()
    accept_as_official(monkeypatch, archive)
    with ArchiveServer(archive, cut=1) as server:
        with pytest.raises(DataError, match=r"connection closed after \d+ of \d+ bytes \(after 1 attempt\)"):
            download_movielens_100k(tmp_path, server.url, attempts=1, progress=False)
        assert (tmp_path / "ml-100k.zip.part").stat().st_size == len(archive) // 2
        download_movielens_100k(tmp_path, server.url, attempts=1, progress=False)
    assert server.ranges == [None, f"bytes={len(archive) // 2}-"]


def test_a_server_that_ignores_ranges_gets_the_whole_file_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = fake_ml100k_archive()
    accept_as_official(monkeypatch, archive)
    with ArchiveServer(archive, cut=1, ranged=False) as server:
        folder = download_movielens_100k(tmp_path, server.url, attempts=2, backoff=0, progress=False)
    assert len(server.ranges) == 2 and (folder / "u.data").read_bytes().count(b"\n") == 5


def test_a_wrong_archive_is_refused_and_not_kept(tmp_path: Path) -> None:
    with ArchiveServer(fake_ml100k_archive()) as server, pytest.raises(DataError) as error:
        download_movielens_100k(tmp_path, server.url, backoff=0, progress=False)
    message = str(error.value)
    assert "\n" not in message
    assert re.search(
        r"is not the official MovieLens-100K \(ml-100k/u\.item: SHA-256 [0-9a-f]{64} differs", message
    )
    assert "--data PATH" in message
    assert list(tmp_path.iterdir()) == []  # neither a folder that looks complete nor the bad archive
    refused = r"is not the official MovieLens-100K \(File is not a zip file\)"
    with ArchiveServer(b"not a zip") as server, pytest.raises(DataError, match=refused):
        download_movielens_100k(tmp_path, server.url, backoff=0, progress=False)


def test_a_missing_file_is_not_retried(tmp_path: Path) -> None:
    with ArchiveServer(b"", status=404) as server, pytest.raises(DataError, match=r"HTTP 404 .*; put the"):
        download_movielens_100k(tmp_path, server.url, attempts=3, backoff=0, progress=False)
    assert len(server.ranges) == 1

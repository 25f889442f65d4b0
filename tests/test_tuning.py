"""The tuning store: round trips, bucketing, bad files, concurrency, lookup order, the hit path."""

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DEVICE
from softmax_ref import assert_softmax_close, random_input
from synthetic_devices import SM90

import tritonsoftmax
from tritonsoftmax import tuning
from tritonsoftmax.config import LaunchConfig, m_bucket
from tritonsoftmax.device import device_info

REPO = Path(__file__).resolve().parent.parent
CFG = LaunchConfig.make(8, BLOCK_N=2048, ROWS=2)


@pytest.fixture(autouse=True)
def user_table(tmp_path, monkeypatch):
    """Every test gets an empty user directory and no shipped tables unless it sets them."""
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path / "user"))
    monkeypatch.setattr(tuning, "shipped_dir", lambda: None)
    tritonsoftmax.clear_caches()
    yield tmp_path / "user"
    tritonsoftmax.clear_caches()


def test_round_trip_and_buckets(user_table):
    path = tuning.record(user_table, SM90, [("fused", torch.float32, 2048, 4096, CFG, 0.0165)])
    assert path == user_table / "cuda" / "sm_90.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["schema"] == 1 and doc["header"]["arch"] == "sm_90" and doc["header"]["backend"] == "cuda"
    hit = tuning.lookup(SM90, "fused", torch.float32, 1500, 5000)  # N 1500 -> bucket 2048, M 5000 -> nearest
    assert hit is not None and hit.config == CFG and hit.ms == pytest.approx(0.0165)
    assert tuning.lookup(SM90, "fused", torch.float32, 2049, 4096) is None  # another N bucket
    assert tuning.lookup(SM90, "fused", torch.float16, 2048, 4096) is None  # another dtype
    assert tuning.lookup(SM90, "online", torch.float32, 2048, 4096) is None  # another family


@pytest.mark.parametrize("write", ["entry", "dispatch winner"])
def test_a_write_keeps_the_entries_and_leaves_no_run_log_in_the_header(user_table, write):
    """The header says what the table is for; an older file's account of its runs (``covers``) is dropped on the
    next write, its entries, policy and dispatch results kept."""
    path = tuning.record(user_table, SM90, [("fused", torch.float32, 2048, 4096, CFG, 0.0165)])
    doc = yaml.safe_load(path.read_text())
    assert set(doc["header"]) == {"device", "backend", "arch", "triton", "torch"}
    doc["header"]["covers"] = ["fused; float32; N 2048; M 4096 [1 of 3 entries recorded]"]
    doc["policy"] = {"few_rows_per_sm": 3}
    path.write_text(yaml.safe_dump(doc))
    if write == "entry":
        tuning.record(user_table, SM90, [("fused", torch.float32, 8192, 4096, CFG, 0.02)])
    else:
        tuning.record_winner(user_table, SM90, ("fwd", "float32", 4480, 4096), "fused", {"fused": 0.02, "smem": 0.03})
    doc = yaml.safe_load(path.read_text())
    assert "covers" not in doc["header"] and doc["header"]["arch"] == "sm_90"
    assert doc["policy"] == {"few_rows_per_sm": 3}
    assert 2048 in doc["entries"]["fused"]["float32"]


def test_an_entry_under_a_length_below_its_bucket_serves_the_rows_up_to_it(user_table):
    short, top, few = (LaunchConfig.make(w, BLOCK_N=8192, ROWS=1) for w in (8, 16, 4))
    tuning.record(user_table, SM90, [("fused", torch.bfloat16, 6144, 4096, short, 0.03)], up_to_n=True)
    doc = yaml.safe_load((user_table / "cuda" / "sm_90.yaml").read_text())
    assert set(doc["entries"]["fused"]["bfloat16"]) == {6144}

    def got(N, M=4096):
        hit = tuning.lookup(SM90, "fused", torch.bfloat16, N, M)
        return hit and hit.config

    assert got(4097) == got(8192) == short, "the bucket's only key serves all of it"
    assert got(4096) is None, "another bucket"
    tuning.record(user_table, SM90, [("fused", torch.bfloat16, 8192, 4096, top, 0.04),
                                     ("fused", torch.bfloat16, 8192, 16, few, 0.01)])
    assert got(4097) == got(6144) == short and got(6145) == got(8192) == top
    assert got(5000, M=16) == few, "no usable M under 6144: the next key's"
    assert tuning.n_keys([6144, 8192, 4096, 16384, 5000, "7000", True], 5500) == [6144, 8192, 5000]
    assert tuning.n_keys([8192], 5000) == [8192] and tuning.n_keys([], 5000) == []


def test_nearest_m_bucket_wins(user_table):
    small = LaunchConfig.make(2, BLOCK_N=2048, ROWS=1)
    tuning.record(user_table, SM90, [("fused", torch.float32, 2048, 4, small, 0.01),
                                     ("fused", torch.float32, 2048, 4096, CFG, 0.02)])
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 8).config == small
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 60000).config == CFG


def test_an_entry_tuned_on_many_rows_is_not_used_for_a_handful(user_table):
    tuning.record(user_table, SM90, [("coop", torch.float32, 131072, 1024, CFG, 0.3)])
    assert tuning.lookup(SM90, "coop", torch.float32, 131072, 4096).config == CFG  # a factor of 4
    assert tuning.lookup(SM90, "coop", torch.float32, 131072, 64).config == CFG  # 16
    assert tuning.lookup(SM90, "coop", torch.float32, 131072, 8) is None  # 128: the heuristic decides


def test_families_that_size_their_grid_from_m_take_no_entry_tuned_on_many_more_rows(user_table):
    """A split entry tuned at 128 rows of 1M elements cut each row for 128 rows; 8 rows took it to
    a third of their speed on the H200. Split and coop take no entry from an M bucket above their
    own (and, as every family, entries tuned on up to NEAREST_M times fewer rows)."""
    from tritonsoftmax import dispatch

    split_cfg = LaunchConfig.make(4, BLOCK=4096, BLOCK_G=8, TILES=32)
    tuning.record(user_table, SM90, [("split", torch.float32, 2**20, 128, split_cfg, 0.4)])
    assert tuning.lookup(SM90, "split", torch.float32, 2**20, 8).config == split_cfg  # within NEAREST_M
    assert tuning.lookup(SM90, "split", torch.float32, 2**20, 8, tuning.NEAREST_M_FEWER_ROWS_GRID_FROM_M) is None
    device = torch.device("cuda" if DEVICE == "cuda" else "cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "device_info", lambda _: SM90)
        assert dispatch.plan("split", 8, 2**20, torch.float32, torch.float32, device).config is None
        assert dispatch.plan("split", 64, 2**20, torch.float32, torch.float32, device).config is None
        for m in (128, 256, 2048):  # the entry's bucket (256) and up to 16 times more rows
            assert dispatch.plan("split", m, 2**20, torch.float32, torch.float32, device).config == split_cfg
        assert dispatch.plan("split", 8192, 2**20, torch.float32, torch.float32, device).config is None


@pytest.mark.parametrize("content", ["{not yaml: [", "schema: 99\nentries: {}\n", "- just\n- a list\n",
                                     "schema: 1\nentries:\n  fused:\n    float32:\n      2048:\n        4096:\n"
                                     "          config: {BLOCK_N: 20"])
def test_bad_file_is_skipped_with_one_warning_naming_it(user_table, content):
    path = user_table / "cuda" / "sm_90.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match="sm_90.yaml") as caught:
        assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096) is None
        assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096) is None
    assert len([w for w in caught if "sm_90.yaml" in str(w.message)]) == 1


def test_bad_file_for_this_device_still_gives_correct_softmax(user_table):
    info = device_info(torch.device(DEVICE))
    path = tuning.table_path(user_table, info)
    path.parent.mkdir(parents=True)
    path.write_text("schema: 1\nentries: [truncated")
    x = random_input((8, 300), torch.float32, DEVICE)
    with pytest.warns(RuntimeWarning, match=path.name):
        y = tritonsoftmax.softmax(x)
    assert_softmax_close(y, x)


def test_entry_from_another_triton_version_is_used(user_table):
    tuning.record(user_table, SM90, [("fused", torch.float32, 2048, 4096, CFG, 0.01)])
    path = user_table / "cuda" / "sm_90.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["entries"]["fused"]["float32"][2048][4096]["triton"] = "2.0.0"
    path.write_text(yaml.safe_dump(doc))
    tuning.forget()
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096).config == CFG


def test_user_directory_is_read_before_shipped_tables(user_table, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    other = LaunchConfig.make(4, BLOCK_N=2048, ROWS=1)
    tuning.record(shipped, SM90, [("fused", torch.float32, 2048, 4096, other, 0.03)])
    monkeypatch.setattr(tuning, "shipped_dir", lambda: shipped)
    tuning.forget()
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096).config == other
    tuning.record(user_table, SM90, [("fused", torch.float32, 2048, 4096, CFG, 0.01)])
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096).config == CFG
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE_SHIPPED", "0")
    (user_table / "cuda" / "sm_90.yaml").unlink()
    tuning.forget()
    assert tuning.lookup(SM90, "fused", torch.float32, 2048, 4096) is None


WRITER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from tritonsoftmax import tuning
    from tritonsoftmax.config import LaunchConfig
    from tritonsoftmax.device import DeviceInfo
    dev = DeviceInfo("cuda", "sm_90", "NVIDIA H200", 32, 132, 232448, 65536)
    worker = int(sys.argv[2])
    for i in range(25):
        cfg = LaunchConfig.make(4, BLOCK=1024 * (worker + 1))
        tuning.record(Path(sys.argv[1]), dev, [("online", torch.float32, 2 ** (i % 23), 4 ** worker, cfg, 0.1)])
""")


def test_two_processes_writing_at_once_leave_a_valid_file_with_both(user_table):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(user_table), str(w)], cwd=REPO) for w in (0, 1)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    doc = yaml.safe_load((user_table / "cuda" / "sm_90.yaml").read_text())
    online = doc["entries"]["online"]["float32"]
    assert len(online) == 23
    assert all(set(by_m) == {1, 4} for by_m in online.values()), "an entry of one writer was lost"
    assert not list((user_table / "cuda").glob("*.tmp")), "a temporary file was left behind"


def test_hit_path_launches_stored_config_without_autotuner(user_table, monkeypatch):
    from tritonsoftmax.kernels import kernel_family, launches

    info = device_info(torch.device(DEVICE))
    stored = LaunchConfig.make(2, BLOCK_N=1024, ROWS=2)
    tuning.record(user_table, info, [("fused", torch.float32, 1000, 64, stored, 0.01)])
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    monkeypatch.setattr(kernel_family.Family, "autotuned", lambda *a: pytest.fail("the autotuner was asked"))
    seen = []
    real = launches.PreparedLaunch.__call__
    monkeypatch.setattr(launches.PreparedLaunch, "__call__", lambda self, x, y, *e: seen.append(real(self, x, y, *e)))
    x = random_input((64, 1000), torch.float32, DEVICE)
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    assert seen == [stored]


def test_stored_config_that_fails_falls_back_to_autotune(user_table, monkeypatch):
    info = device_info(torch.device(DEVICE))
    broken = LaunchConfig.make(2, BLOCK_N=1000, ROWS=1)  # not a power of two: tl.arange rejects it
    tuning.record(user_table, info, [("fused", torch.float32, 1000, 16, broken, 0.01)])
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    x = random_input((16, 1000), torch.float32, DEVICE)
    with pytest.warns(RuntimeWarning, match="autotuning instead"):
        y = tritonsoftmax.softmax(x)
    assert_softmax_close(y, x)


def test_autotune_winner_is_saved_when_asked(user_table, monkeypatch):
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_SAVE", "1")
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    x = random_input((4, 700), torch.float32, DEVICE)
    assert_softmax_close(tritonsoftmax.softmax(x, impl="online"), x)
    info = device_info(x.device)
    assert tuning.lookup(info, "online", torch.float32, 700, 4) is not None


def test_tuner_command_writes_a_table(tmp_path):
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--dtypes", "float32", "--n-min", "512",
                          "--n-max", "1024", "--m", "4", "--rep-ms", "5", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "found in sys.modules" not in run.stderr, run.stderr  # the package does not import its tuner
    assert "[3/3]" in run.stdout and "N=509 " in run.stdout, run.stdout  # 509: the odd length beside 512
    assert "bucket 512: " in run.stdout, run.stdout  # one entry chosen across 509 and 512
    files = list(out.rglob("*.yaml"))
    assert len(files) == 1
    data = yaml.safe_load(files[0].read_text())
    assert set(data["entries"]["fused"]["float32"]) == {512, 1024}
    assert "N 512..1024; odd lengths beside the tops" in run.stdout, run.stdout  # what the run covers, said once
    assert "wrote 2 of 2 entries" in run.stdout and "covers" not in data["header"], run.stdout
    empty = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--n-min", "2048", "--n-max", "1024",
                            "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert empty.returncode == 2 and "no bucket between" in empty.stderr, empty.stderr


def test_a_default_tune_puts_an_odd_length_beside_each_short_bucket_top():
    """Without --n the tuner times each bucket of 8..512 at its top and at top - 3: rows off 16 bytes rank short-row
    configs differently; --no-odd and longer buckets keep the top alone."""
    from tritonsoftmax.config import n_bucket
    from tritonsoftmax.tune import ODD_BESIDE_MAX, _parse, default_lengths

    assert default_lengths(1, 2048) == [1, 2, 4, 5, 8, 13, 16, 29, 32, 61, 64, 125, 128, 253, 256, 509, 512, 1024, 2048]
    assert default_lengths(1, 64, odd=False) == [1, 2, 4, 8, 16, 32, 64]
    assert default_lengths(300, 600) == [509, 512]  # from n_min's bucket up to n_max
    assert default_lengths(300, 300) == []  # no bucket top in range: the command says so (above)
    assert all(n_bucket(n - 3) == n and (n - 3) % 2 for n in (8, 16, 32, 64, 128, 256, ODD_BESIDE_MAX))
    assert _parse(["--no-odd"]).no_odd and not _parse([]).no_odd


def test_tuner_exact_lengths_are_stored_under_their_bucket(tmp_path):
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--families", "fused", "--dtypes", "float32",
                          "--n", "700", "3", "--m", "4", "--rep-ms", "5", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "N=3 " in run.stdout and "N=700 " in run.stdout and "[2/2]" in run.stdout, run.stdout
    (table,) = out.rglob("*.yaml")
    data = yaml.safe_load(table.read_text())
    assert set(data["entries"]["fused"]["float32"]) == {4, 1024}  # the buckets of 3 and 700
    assert "N 3/700" in run.stdout, run.stdout
    bad = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--n", "0", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--n" in bad.stderr


def test_one_entry_for_several_lengths_in_a_bucket_is_the_config_least_behind_at_its_worst():
    from tritonsoftmax.tune import choose_across_lengths

    # "a" is fastest at 512 only; "b" is never fastest but never more than 4 % behind; "c" did not run at 300.
    timings = {(300, 16): {"a": 12.0, "b": 9.3, "c": 1.0}, (400, 16): {"a": 11.0, "b": 9.6},
               (512, 16): {"a": 10.0, "b": 10.4}}
    timings[(300, 16)].pop("c")
    timings[(300, 16)]["d"] = 9.0
    assert choose_across_lengths(timings) == ("b", pytest.approx(1.04))
    assert choose_across_lengths({(512, 4): {"a": 2.0, "b": 1.0}}) == ("b", 1.0)
    assert choose_across_lengths({(300, 4): {"a": 1.0}, (400, 4): {"b": 1.0}}) == (None, None)
    tie = {(300, 4): {"a": 1.0, "b": 1.0}, (400, 4): {"a": 1.1, "b": 1.0}, (512, 4): {"a": 1.1, "b": 1.1}}
    assert choose_across_lengths(tie)[0] == "b"  # same worst share (1.1): the least summed share wins


@pytest.mark.parametrize("up_to", [False, True], ids=["bucket", "up-to"])
def test_tuner_lengths_in_one_bucket_give_one_entry(tmp_path, up_to):
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--families", "fused", "--dtypes", "float32",
                          "--n", "300", "400", "--m", "4", "--rep-ms", "5", "--out", str(out)]
                         + (["--up-to"] if up_to else []),
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "2 shapes (1 entry)" in run.stdout and "bucket 512" in run.stdout, run.stdout
    assert "over 4x300/4x400" in run.stdout, run.stdout
    (table,) = out.rglob("*.yaml")
    data = yaml.safe_load(table.read_text())
    key = 400 if up_to else 512
    assert set(data["entries"]["fused"]["float32"]) == {key}
    assert set(data["entries"]["fused"]["float32"][key]) == {4}
    assert "N 300/400" in run.stdout, run.stdout
    assert ("entries up to the longest length" in run.stdout) == up_to, run.stdout
    assert ("bucket 512 (entry up to 400): " in run.stdout) == up_to, run.stdout
    if up_to:
        bad = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--up-to", "--out", str(out)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert bad.returncode == 2 and "--up-to" in bad.stderr


def test_tuner_row_counts_in_one_m_bucket_give_one_entry(tmp_path):
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--families", "fused", "--dtypes", "float32",
                          "--n", "300", "--m", "8", "16", "2", "--rep-ms", "5", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "3 shapes (2 entries)" in run.stdout and "over 8x300/16x300" in run.stdout, run.stdout
    (table,) = out.rglob("*.yaml")
    entries = yaml.safe_load(table.read_text())["entries"]["fused"]["float32"]
    assert set(entries) == {512} and set(entries[512]) == {4, 16}
    assert "replaces" not in run.stdout, run.stdout
    again = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--families", "fused", "--dtypes", "float32",
                            "--n", "300", "--m", "16", "--rep-ms", "5", "--out", str(out)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    was = LaunchConfig.from_dict(entries[512][16]["config"])
    assert f"replaces {was}: " in again.stdout and "x the new entry's time at worst" in again.stdout, again.stdout
    near = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--families", "fused", "--dtypes", "float32",
                           "--n", "300", "--m", "64", "--rep-ms", "5", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert near.returncode == 0, near.stderr
    now = LaunchConfig.from_dict(yaml.safe_load(table.read_text())["entries"]["fused"]["float32"][512][16]["config"])
    assert f"replaces the nearest entry's config {now}: " in near.stdout, near.stdout  # M bucket 16 served 64


def test_tuner_says_when_a_dispatch_rule_fixes_a_shapes_config(tmp_path, monkeypatch, capsys):
    """An entry tuned at a shape whose config a rule fixes (dispatch.ruled_config: fused's held rows, smem's fp32
    cluster rows) is not what auto runs there: the tuner says so, and still records it for the bucket's other
    shapes."""
    from tritonsoftmax import dispatch, tune

    real = dispatch.ruled_config
    monkeypatch.setattr(dispatch, "ruled_config",
                        lambda name, s: LaunchConfig.make(1, BLOCK_N=512, ROWS=1) if (name, s.M) == ("fused", 8)
                        else real(name, s))
    out = tmp_path / "tuned"
    assert tune.main(["--families", "fused", "--dtypes", "float32", "--n", "300", "--m", "8", "64", "--rep-ms", "5",
                      "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: a dispatch rule fixes fused's config at 8x300 (dispatch.ruled_config)" in printed, printed
    assert printed.count("note: a dispatch rule") == 1, printed
    (table,) = out.rglob("*.yaml")
    assert set(yaml.safe_load(table.read_text())["entries"]["fused"]["float32"][512]) == {16, 64}


def test_tuner_says_when_max_elements_cuts_the_rows_asked_for(tmp_path, capsys):
    """--m asks for row counts; --max-elements caps M * N (a 64K-bucket tune at 4096 rows runs fewer, which the table
    must not hide): the tuner says which lengths ran fewer rows, and the entry sits
    under the M bucket of the rows that ran."""
    from tritonsoftmax import tune

    out = tmp_path / "tuned"
    assert tune.main(["--families", "fused", "--dtypes", "float32", "--n", "300", "--m", "64", "--rep-ms", "5",
                      "--max-elements", "6000", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "note: --max-elements 6000 tunes fewer rows than asked at N=300 (20 of 64)" in printed, printed
    (table,) = out.rglob("*.yaml")
    assert set(yaml.safe_load(table.read_text())["entries"]["fused"]["float32"][512]) == {m_bucket(20)}
    assert tune.main(["--families", "fused", "--dtypes", "float32", "--n", "300", "--m", "16", "--rep-ms", "5",
                      "--out", str(out)]) == 0
    assert "note: --max-elements" not in capsys.readouterr().out


def test_tuner_asks_for_auto_as_the_workloads_rows_are_laid_out(tmp_path, monkeypatch):
    """--families auto tunes the family auto runs on the tuner's own rows, which are contiguous: rows off 16 bytes
    where N does not fill whole 16-byte vectors (the dispatcher sends dense odd rows to smem's odd-row form,
    aligned or not), on them where it does."""
    from tritonsoftmax import dispatch, tune

    asked = []
    real = dispatch.choose

    def choose(M, N, dtype, device, backward=False, aligned=True, dense=False):
        asked.append((N, aligned, dense))
        return real(M, N, dtype, device, backward, aligned, dense)

    monkeypatch.setattr(dispatch, "choose", choose)
    assert tune.main(["--families", "auto", "--dtypes", "float32", "--n", "300", "301", "--m", "8", "--rep-ms", "5",
                      "--out", str(tmp_path / "tuned")]) == 0
    assert sorted(set(asked)) == [(300, True, True), (301, False, True)]


def test_tuner_backward_writes_bwd_entries_that_dispatch_uses(tmp_path, monkeypatch):
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--backward", "--families", "online",
                          "--dtypes", "float32", "--n-min", "2048", "--n-max", "2048", "--m", "4", "--rep-ms", "5",
                          "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    (table,) = out.rglob("*.yaml")
    entries = yaml.safe_load(table.read_text())["entries"]
    assert set(entries) >= {"online-bwd"} and 2048 in entries["online-bwd"]["float32"]
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(out))
    tritonsoftmax.clear_caches()
    from tritonsoftmax import dispatch

    p = dispatch.plan("online", 4, 2048, torch.float32, torch.float32, torch.device(DEVICE), backward=True)
    assert p.from_store and p.family.name == "online-bwd"


@pytest.mark.needs("sm90_table")
@pytest.mark.gpu
def test_committed_table_first_call_for_a_new_shape_does_no_benchmarking(monkeypatch):
    from tritonsoftmax.kernels import kernel_family

    monkeypatch.setattr(tuning, "shipped_dir", lambda: REPO / "tune_cache")
    monkeypatch.setenv("TRITONSOFTMAX_AUTOTUNE", "1")
    monkeypatch.setattr(kernel_family.Family, "autotuned", lambda *a: pytest.fail("the autotuner was asked"))
    tritonsoftmax.clear_caches()
    for M, N, dtype in [(4096, 3000, torch.float32), (1000, 700, torch.bfloat16), (4096, 70000, torch.float16)]:
        x = random_input((M, N), dtype, DEVICE, seed=N)
        assert_softmax_close(tritonsoftmax.softmax(x), x)


def test_shipped_tables_are_inside_the_wheel_and_found_from_it(tmp_path):
    wheel_dir = tmp_path / "wheel"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(wheel_dir), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    in_repo = sorted(p.relative_to(REPO / "tune_cache").as_posix() for p in (REPO / "tune_cache").rglob("*.yaml"))
    in_wheel = sorted(p.relative_to(site / "tritonsoftmax" / "tune_cache").as_posix()
                      for p in (site / "tritonsoftmax" / "tune_cache").rglob("*.yaml"))
    assert in_wheel == in_repo
    assert (site / "tritonsoftmax" / "tune_cache" / "README.md").is_file()
    probe = subprocess.run([sys.executable, "-c", "from tritonsoftmax import tuning; print(tuning.shipped_dir())"],
                           cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()) == site / "tritonsoftmax" / "tune_cache"


def test_entries_record_a_kernel_timer_and_lookup_reads_them_as_any_other(tmp_path, monkeypatch):
    cfg = LaunchConfig.make(2, BLOCK=2048, BLOCK_G=64, TILES=1)
    tuning.record(tmp_path, SM90, [("coop", torch.float16, 131072, 8, cfg, 0.00466)], timer="kernel")
    tuning.record(tmp_path, SM90, [("coop", torch.float16, 131072, 1, cfg, 0.0065)])
    by_m = yaml.safe_load(tuning.table_path(tmp_path, SM90).read_text())["entries"]["coop"]["float16"][131072]
    assert by_m[16]["timer"] == "kernel" and "timer" not in by_m[1]
    monkeypatch.setattr(tuning, "roots", lambda: [tmp_path])
    entry = tuning.lookup(SM90, "coop", torch.float16, 131072, 8)
    assert entry is not None and entry.config == cfg and entry.ms == pytest.approx(0.00466)


def test_tuner_refuses_the_kernel_timer_without_a_gpu(tmp_path):
    if DEVICE != "cpu":
        pytest.skip("checks the refusal without a GPU")
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--timer", "kernel", "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "needs a GPU" in run.stderr
    assert not list(tmp_path.rglob("*.yaml"))


def test_tuner_times_each_config_as_the_dispatcher_will_run_it(tmp_path, monkeypatch, capsys):
    """The tuner prepares every config of the space, and the chosen one for its error check, through the family's
    dispatched_form: what a launch from a stored entry runs (smem cuts a bucket's config to the row, so a length
    below the bucket's top must be timed cut, as it will run)."""
    from tritonsoftmax import tune
    from tritonsoftmax.kernels import fused, kernel_family

    formed, prepared = [], []
    real_prepare = kernel_family.Family.prepare

    def dispatched_form(self, problem, config, device, modes=None):
        formed.append(config)
        return config.with_options(marked=1)

    def prepare(self, problem, config, device, from_store=False, flags=None, modes=None):
        prepared.append(config)
        unmarked = LaunchConfig.make(config.num_warps, config.num_stages,
                                     {k: v for k, v in config.options if k != "marked"}, **dict(config.meta))
        return real_prepare(self, problem, unmarked, device, from_store, flags)  # a GPU launch rejects "marked"

    monkeypatch.setattr(kernel_family.Family, "dispatched_form", dispatched_form)
    monkeypatch.setattr(kernel_family.Family, "prepare", prepare)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tune.main(["--families", "fused", "--dtypes", "float32", "--n", "300", "--m", "4", "--rep-ms", "5",
                      "--out", str(tmp_path / "tuned")]) == 0
    space = fused.FAMILY.configs(device_info(torch.device(DEVICE)), 4, 300)
    assert len(formed) == len(space) + 1 and set(formed[:-1]) == set(space), (formed, space)
    assert all(dict(c.options).get("marked") == 1 for c in prepared) and len(prepared) == len(formed)
    assert "[1/1]" in capsys.readouterr().out


# Shipped sm_90 entries whose configs today's search space no longer produces at their key: split's chunking
# (_shape_config) changed after they were tuned (events timer). They are still valid configs: SplitLaunch
# validates BLOCK_G against the row's chunks when it prepares one.
_OUT_OF_SPACE_SM90 = {("split", "float32", 1048576, 256), ("split-bwd", "bfloat16", 1048576, 256),
                      ("split-bwd", "bfloat16", 4194304, 64), ("split-bwd", "float16", 4194304, 64),
                      ("split-bwd", "float32", 1048576, 256), ("split-bwd", "float32", 4194304, 64)}


def test_every_shipped_sm90_entry_names_its_kernels_parameters_and_is_a_config_of_its_search_space():
    """A hand-merged table (tuner runs' output merged by hand) must not carry a misspelt or stray parameter, a warp
    count the H200 cannot run, or a config no search space holds: each entry is checked against its family's kernel
    signature and its search space at the entry's own key, on the synthetic H200."""
    from shipped_tables import sm90_entries

    from tritonsoftmax.kernels import backward_family, family

    entries = sm90_entries()
    out_of_space = 0
    for name, dtype, n, m, config in entries:
        fam = backward_family(name.removesuffix("-bwd")) if name.endswith("-bwd") else family(name)
        where = (name, dtype, n, m)
        assert set(dict(config.meta)) <= set(fam.kernel.arg_names), (where, config)
        assert config.num_warps in (1, 2, 4, 8, 16, 32), where
        if (config.meta, config.num_warps) not in {(c.meta, c.num_warps) for c in fam.configs(SM90, m, n)}:
            assert where in _OUT_OF_SPACE_SM90, (where, config)
            out_of_space += 1
    assert len(entries) > 300 and out_of_space <= len(_OUT_OF_SPACE_SM90)


def test_family_tuner_records_each_points_winner_and_resumes(tmp_path):
    """python -m tritonsoftmax.tune --dispatch times the families a point's shape allows against each other, writes
    the winner and every family's time into the table's dispatch: mapping (leaving its entries alone), says where
    it is as it goes, and a second run skips the points the table holds; --part takes every N-th point."""
    out = tmp_path / "tuned"
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1" if DEVICE == "cpu" else "0"}
    cmd = [sys.executable, "-m", "tritonsoftmax.tune", "--dispatch", "--dtypes", "float32", "--n", "64", "300",
           "--m", "4", "--directions", "fwd", "--out", str(out)]
    first = subprocess.run(cmd + ["--part", "1/2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "1 points in part 1/2, 0 already" in first.stdout, first.stdout
    assert "[1/1] fwd float32 4x64: " in first.stdout, first.stdout
    whole = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert "2 points in part 1/1, 1 already" in whole.stdout and "4x300" in whole.stdout, whole.stdout
    (path,) = out.rglob("*.yaml")
    doc = yaml.safe_load(path.read_text())
    points = doc["dispatch"]["fwd"]["float32"]
    assert set(points) == {64, 300} and all(set(points[n]) == {4} for n in points)
    for n in (64, 300):
        item = points[n][4]
        want = "fused" if DEVICE == "cpu" else item["family"]
        assert {"fused", "online", "split"} <= set(item["ms"]) and item["family"] in item["ms"]
        assert item["family"] == want or item["ms"][item["family"]] <= min(item["ms"].values()) * 1.02
    assert doc["entries"] == {}
    bad = subprocess.run(cmd + ["--part", "3/2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--part takes K/N" in bad.stderr, bad.stderr


def test_family_tuner_keeps_the_rules_choice_within_the_margin():
    from tritonsoftmax.tune_dispatch import grid, pick

    assert pick({"fused": 1.0, "online": 0.99}, "fused", 0.02) == "fused"
    assert pick({"fused": 1.0, "online": 0.97}, "fused", 0.02) == "online"
    assert pick({"online": 0.97}, "fused", 0.02) == "online", "the rules' family did not run"
    assert grid(["float32"], ["fwd"], [2**20, 2**22], [1, 4096], 2**27) == [
        ("fwd", "float32", 2**20, 1), ("fwd", "float32", 2**20, 128), ("fwd", "float32", 2**22, 1),
        ("fwd", "float32", 2**22, 32)]


def test_auto_runs_the_measured_winner_where_the_family_tuner_measured(tmp_path, monkeypatch):
    """A winner in the user's table decides auto for rows of exactly that length at row counts of its M bucket
    (1025..4096 for 4096), contiguous rows only; a family the shape cannot run (smem on rows it cannot copy) and other
    lengths leave the rules in charge."""
    from synthetic_devices import SM90

    from tritonsoftmax import dispatch, tuning
    from tritonsoftmax.kernels import gluon_available

    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path))
    tuning.record_winner(tmp_path, SM90, ("fwd", "bfloat16", 4480, 4096), "online", {"online": 1.0, "fused": 1.1})
    tuning.record_winner(tmp_path, SM90, ("bwd", "float32", 1000, 4096), "smem", {"smem": 1.0, "fused": 1.1})
    dispatch.clear_cache()
    try:
        bf = torch.bfloat16
        assert dispatch.choose(4096, 4480, bf, SM90, aligned=True, dense=True).impl == "fused", "the rules"
        assert dispatch.resolve("auto", 4096, 4480, bf, SM90, False, True, True).impl == "online"
        assert dispatch.resolve("auto", 1025, 4480, bf, SM90, False, True, True).impl == "online", "M's bucket"
        assert dispatch.resolve("auto", 1024, 4480, bf, SM90, False, True, True).impl == "fused", "another M bucket"
        assert dispatch.resolve("auto", 4096, 4480, bf, SM90, True, True, True).impl == "fused", "the backward"
        assert dispatch.resolve("auto", 4096, 4480, bf, SM90, False, True, False).impl == "fused", "padded rows"
        assert dispatch.resolve("auto", 4096, 4488, bf, SM90, False, True, True).impl == "fused", "another length"
        assert dispatch.resolve("fused", 4096, 4480, bf, SM90, False, True, True).impl == "fused", "asked by name"
        # 1000 fp32 elements are whole 16-byte vectors, and smem copies them on an sm_90: the winner holds
        assert dispatch.resolve("auto", 4096, 1000, torch.float32, SM90, True, True, True).impl == (
            "smem" if gluon_available() else "fused")
    finally:
        dispatch.clear_cache()


def test_held_rows_tuner_picks_the_longest_run_of_one_winning_warp_count():
    """The held-rows tuner's reading of its times: a length's winner is its fastest warp count where that beats auto
    by the margin; a block's entry is the longest run of consecutive lengths with one winner (first, last, warps);
    the measured blocks replace theirs in the policy's held_rows, a block without a run loses its entry."""
    from tritonsoftmax.tune_held_rows import lengths, longest_run, merged_entries, warp_counts, winner

    assert lengths(8192, 16, 2) == list(range(4352, 8192, 256))
    assert lengths(64, 4, 2) == [40, 48, 56] and lengths(64, 4, 4) == [40, 48, 56]
    assert lengths(64, 16, 2) == [40, 48, 56], "no finer than a 16-byte vector"
    from synthetic_devices import GFX942, SM90

    assert warp_counts(1024, [2, 4, 8, 16, 32], SM90) == [2, 4, 8, 16], "at least one element of the half a thread"
    assert warp_counts(1024, [2, 4, 8, 16], GFX942) == [2, 4, 8], "64-lane waves"
    assert warp_counts(65536, [16, 32], SM90) == [16, 32] and warp_counts(65536, [16, 32], GFX942) == [16]
    assert winner({"auto": 1.0, 4: 0.90, 8: 0.95}, 0.02) == 4
    assert winner({"auto": 1.0, 4: 0.99}, 0.02) is None, "within the margin: auto"
    assert winner({"auto": 1.0}, 0.02) is None and winner({4: 1.0}, 0.02) is None
    assert longest_run({4352: None, 4608: 4, 4864: 4, 5120: 8, 5376: 4, 5632: 4, 5888: 4}) == [5376, 5888, 4]
    assert longest_run({1: 8, 2: None, 3: 4}) == [1, 1, 8], "equal runs: the first"
    assert longest_run({1: None}) is None
    current = {"fwd": {2: {16384: (8193, 9216, 8)}}, "bwd": {2: {8192: (4800, 7360, 4)}}}
    assert merged_entries(current, {("bwd", 2, 8192): None, ("fwd", 4, 2048): [1088, 1920, 2]}) == {
        "fwd": {2: {16384: [8193, 9216, 8]}, 4: {2048: [1088, 1920, 2]}}}
    assert current["bwd"][2][8192] == (4800, 7360, 4), "the policy's own value is left alone"


def test_held_rows_tuner_times_real_launches_and_writes_the_policy(tmp_path, monkeypatch, capsys):
    """python -m tritonsoftmax.tune --held-rows runs auto (the rules without held_rows) and the held fused kernel on
    each warp count at every length (on the CPU: the interpreter's kernels, each checked against float64), and writes
    what its times say into the table's policy, where the dispatcher reads it: 16-bit dtypes that disagree at a
    length give no winner there. The times here are scripted over the real measurements."""
    from tritonsoftmax import dispatch, policy, tune, tune_held_rows
    from tritonsoftmax.device import device_info

    if DEVICE != "cpu":
        pytest.skip("scripted times over the interpreter's launches")
    real = tune_held_rows.measure
    ran = []

    def scripted(direction, dtype, block, N, M, warps, info, dev, timer):
        times = real(direction, dtype, block, N, M, warps, info, dev, timer)
        ran.append((direction, dtype, N, sorted(k for k in times if k != "auto")))
        two_wins = direction == "fwd" or (N != 96 or dtype == torch.bfloat16)
        return {"auto": 1.0, 1: 0.99, 2: 0.5 if two_wins else 1.5}

    monkeypatch.setattr(tune_held_rows, "measure", scripted)
    monkeypatch.setenv("TRITONSOFTMAX_TUNE_CACHE", str(tmp_path))
    args = ["--held-rows", "--dtypes", "bfloat16", "float16", "--blocks", "128", "--steps", "4", "--m", "3",
            "--warps", "1", "2", "--out", str(tmp_path)]
    try:
        assert tune.main(args) == 0
        assert len(ran) == 12 and all(w == [1, 2] for *_, w in ran), "both warp counts ran at every point"
        out = capsys.readouterr().out
        assert "held_rows fwd 2-byte 128: [80, 112, 2]" in out and "held_rows bwd 2-byte 128: [80, 80, 2]" in out
        dispatch.clear_cache()
        info = device_info(torch.device("cpu"))
        assert policy.policy_for(info).held_rows == {"fwd": {2: {128: (80, 112, 2)}}, "bwd": {2: {128: (80, 80, 2)}}}
    finally:
        dispatch.clear_cache()
    bad = subprocess.run([sys.executable, "-m", "tritonsoftmax.tune", "--held-rows", "--blocks", "100"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--blocks takes powers of two" in bad.stderr, bad.stderr

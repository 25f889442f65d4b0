"""The benchmark sweep runs end to end (on the CPU under the interpreter) and merges its parts."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAS_GPU

REPO = Path(__file__).resolve().parent.parent


def _sweep(out, *args):
    run = subprocess.run([sys.executable, "-m", "bench.sweep", "--out", str(out), *args], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return run.stdout


@pytest.mark.skipif(HAS_GPU, reason="the CPU pipeline check; on a GPU the sweep is run by hand")
def test_cpu_sweep_writes_plots_csvs_and_a_merged_summary(tmp_path):
    first = _sweep(tmp_path, "--plots", "m64", "--providers", "auto", "fused", "torch", "copy", "liger")
    assert "measure the interpreter, not a GPU" in first
    progress = [line for line in first.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in progress] == ["[1/3]", "[2/3]", "[3/3]"], first
    assert all("x the best peer (torch.softmax " in line and "0.00x" not in line for line in progress), first
    assert sum("liger" in line for line in first.splitlines()) == 1, "a skipped provider: one line, at the end"
    assert "liger: liger_kernel.ops.softmax runs on the GPU only (3 points" in first
    assert first.rstrip().endswith(f"wrote {tmp_path}/: summary.md, results.html, 1 plot with their CSVs")
    _sweep(tmp_path, "--plots", "few-16384", "--providers", "auto", "online", "naive")
    for name in ("m64-float32.png", "m64-float32.csv", "few-16384-float32.png", "few-16384-float32.csv"):
        assert (tmp_path / name).is_file(), name
    html = (tmp_path / "results.html").read_text()
    assert 'src="m64-float32.png"' in html and 'src="few-16384-float32.png"' in html, "every plot, both parts'"
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("python -m bench.sweep") == 2, "both parts' commands are listed"
    assert "## m64, float32" in summary and "## few-16384, float32" in summary
    assert "time the Triton interpreter" in summary
    assert "liger: liger_kernel.ops.softmax runs on the GPU only" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| 64×1024"))
    assert "–" not in row.split("|")[1:4], "auto, fused and torch all measured"


@pytest.mark.skipif(HAS_GPU, reason="the CPU pipeline check; on a GPU the sweep is run by hand")
def test_cpu_backward_sweep(tmp_path):
    _sweep(tmp_path, "--mode", "bwd", "--plots", "m64", "--shapes", "64x1024",
           "--providers", "auto", "split", "torch", "naive", "copy", "tutorial")
    summary = (tmp_path / "summary.md").read_text()
    row = next(line for line in summary.splitlines() if line.startswith("| 64×1024"))
    assert "–" not in row.split("|")[1:6]
    assert "tutorial: the tutorial kernel has no backward" in summary


def test_torch_compile_peer_gets_its_own_code_object_per_point(monkeypatch):
    """Dynamo keeps graphs per code object: one shared lambda over a whole grid hits the recompile
    limit and silently runs eager from the 9th point on."""
    import torch

    from bench import peers

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append((fn, kw)) or fn)
    first = peers.compiled_per_point(peers._softmax_last)
    second = peers.compiled_per_point(peers._softmax_last)
    assert first.__code__ is not second.__code__
    assert first.__code__ is not peers._softmax_last.__code__
    assert all(kw == {"dynamic": False} for _, kw in seen)
    x = torch.randn(3, 5)
    torch.testing.assert_close(first(x), torch.softmax(x, -1))
    dy, y = torch.randn(3, 5), torch.softmax(torch.randn(3, 5), -1)
    grad = peers.compiled_per_point(peers._softmax_grad_last)
    torch.testing.assert_close(grad(dy, y), y * (dy - (dy * y).sum(-1, keepdim=True)))


def test_kernel_time_sums_the_calls_kernels_and_leaves_out_the_flush():
    from tritonsoftmax.kernel_timer import per_call

    flush = {"fill<int8>"}
    records = [("fill<int8>", 10, 700.0), ("Memset (Device)", 10, 1.0), ("softmax", 10, 19.0)]
    assert per_call(records, flush, 10) == [("softmax", 1.0, 1.9), ("Memset (Device)", 1.0, 0.1)]
    with pytest.raises(RuntimeError, match="cannot be separated"):
        per_call([("fill<int8>", 20, 1400.0), ("softmax", 10, 19.0)], flush, 10)
    with pytest.raises(RuntimeError, match="no kernel"):
        per_call([("fill<int8>", 10, 700.0)], flush, 10)


def test_per_kernel_rows_come_from_the_same_intervals_as_the_busy_time():
    """kernel_profile's rows and its busy time read one list of device intervals: per kind of activity its
    count and summed duration (activities of no duration left out)."""
    from tritonsoftmax.kernel_timer import _records, per_call

    intervals = [("fill<int8>", 0.0, 60.0), ("softmax", 61.0, 63.0), ("Memset (Device)", 63.0, 63.0),
                 ("fill<int8>", 70.0, 130.0), ("softmax", 131.0, 134.0)]
    assert sorted(_records(intervals)) == [("fill<int8>", 2, 120.0), ("softmax", 2, 5.0)]
    assert per_call(_records(intervals), {"fill<int8>"}, 2) == [("softmax", 1.0, 2.5)]


def test_busy_time_counts_overlapping_kernels_once_and_leaves_out_the_flush():
    from tritonsoftmax.kernel_timer import busy_per_call

    flush = {"fill<int8>"}
    calls = [
        # split's two passes, the second a dependent launch starting while the first ends: 26.3, not 32.3
        ("fill<int8>", 0.0, 60.0), ("stats", 61.0, 75.7), ("write", 69.7, 87.3),
        # one after the other with a gap (not counted): 3 + 2
        ("fill<int8>", 100.0, 160.0), ("a", 161.0, 164.0), ("b", 170.0, 172.0),
        # one kernel inside another's interval: 10
        ("fill<int8>", 200.0, 260.0), ("outer", 261.0, 271.0), ("inner", 263.0, 265.0),
    ]
    assert busy_per_call(calls, flush, 3) == pytest.approx((26.3 + 5.0 + 10.0) / 3)
    assert busy_per_call(calls[:3], flush, 1) == pytest.approx(26.3)
    with pytest.raises(RuntimeError, match="cannot be told apart"):
        busy_per_call(calls, flush, 2)
    with pytest.raises(RuntimeError, match="no kernel"):
        busy_per_call([("fill<int8>", 0.0, 60.0)], flush, 1)


@pytest.mark.skipif(HAS_GPU, reason="checks the refusal without a GPU")
def test_kernel_timer_needs_a_gpu(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench.sweep", "--out", str(tmp_path), "--timer", "kernel"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "needs a GPU" in run.stderr
    assert not list(tmp_path.glob("points-*.json"))


def test_summary_names_each_parts_timer_and_flags_a_mix(tmp_path):
    import json

    from bench.report import write_summary

    def part(name, timer, seq):
        meta = {"command": f"python -m bench.sweep {name}", "device": "GPU", "torch": "2", "triton": "3",
                "repeats": 3, "rep_ms": 30.0, "interpreter": False, "autotune": "0", "skipped": {},
                "seq": seq, **({"timer": timer} if timer else {})}
        pts = [{"plot": "design", "dtype": "float32", "M": 8, "N": 2048, "gbps": {"auto": 70.0, "liger": 68.0}}]
        (tmp_path / f"points-{name}.json").write_text(json.dumps({"meta": meta, "points": pts}))

    part("a", None, 1)  # a part that records no timer: do_bench
    text = write_summary(tmp_path)
    assert "x do_bench 30.0 ms" in text and "timed differently" not in text
    part("b", "kernel", 2)
    text = write_summary(tmp_path)
    assert "kernels each call launched (CUPTI" in text and "timed differently" in text
    assert "| 8×2048 | " in text and "| 1.03 | 2 |" in text


@pytest.mark.needs("cupti")
@pytest.mark.gpu
def test_kernel_profile_counts_every_kernel_of_a_call_and_only_their_busy_time():
    """What the timer records, not a ratio of two timings: one launch a call of each kernel the function runs, and a
    busy time that is the kernels' own durations (one after another on a stream: their sum), with no gap between
    them and no event time."""
    import torch

    from tritonsoftmax.kernel_timer import kernel_profile

    a = torch.randn(8 * 1024 * 1024, device="cuda")
    one = kernel_profile(lambda: a.mul_(1.0), calls=10)
    two = kernel_profile(lambda: (a.mul_(1.0), a.add_(0.0)), calls=10)
    assert [launches for _, launches, _ in one.rows] == [1.0], one
    assert sum(launches for _, launches, _ in two.rows) == 2.0, two
    durations = [us for _, _, us in two.rows]
    assert two.busy_us == pytest.approx(sum(durations), rel=1e-3), two
    assert one.busy_us == pytest.approx(one.rows[0][2], rel=1e-3), one


@pytest.mark.needs("cupti", "pdl")
@pytest.mark.gpu
def test_kernel_time_counts_splits_dependent_second_pass_once():
    """Split's pass 2 starts (PDL) while pass 1 ends on sm_90+: the busy time is below the two durations'
    sum there, never below the longer one, and equal to the sum where the passes run one after the other."""
    import torch

    import tritonsoftmax
    from tritonsoftmax.kernel_timer import kernel_profile

    x = torch.randn(1, 8388608, device="cuda")
    profile = kernel_profile(lambda: tritonsoftmax.softmax(x, -1, impl="split"), calls=10)
    durations = [us for _, _, us in profile.rows]
    assert len(durations) == 2 and max(durations) <= profile.busy_us <= sum(durations) * 1.001, profile
    if torch.cuda.get_device_capability() >= (9, 0):
        assert profile.busy_us < 0.95 * sum(durations), profile


def test_measure_interleaves_rounds_and_keeps_each_providers_kernels(monkeypatch):
    """sweep.measure with the kernel timer: one profile per provider per round, in round order (a, b,
    a, b), each round's time the profile's busy time, and the last round's kernel list kept."""
    from bench import sweep
    from tritonsoftmax import kernel_timer

    order, us = [], {"a": iter([10.0, 12.0]), "b": iter([5.0, 7.0])}

    def fake_profile(fn, calls=30):
        name = fn()
        order.append(name)
        busy = next(us[name]) + 1.0  # the kernel, then the memset after it
        return kernel_timer.KernelProfile([(f"{name}_kernel", 1.0, busy - 1.0), ("memset", 2.0, 1.0)], busy)

    monkeypatch.setattr(kernel_timer, "kernel_profile", fake_profile)
    times, launched = sweep.measure({"a": lambda: "a", "b": lambda: "b"}, 2, "kernel", 30.0)
    assert order == ["a", "b", "a", "b"]
    assert times == {"a": [0.011, 0.013], "b": [0.006, 0.008]}
    assert launched["a"] == [["a_kernel", 1.0, 12.0], ["memset", 2.0, 1.0]]


def test_overhead_times_every_function_each_round_in_alternating_order(monkeypatch):
    """bench.overhead's host times: each round times every function once, the order reversed every other
    round, and the reported time is each function's median over the rounds."""
    import torch

    from bench import overhead

    order = []
    times = {"torch": iter([5.0, 9.0, 6.0]), "ours": iter([8.0, 7.0, 1.0])}
    fns = [lambda: "torch", lambda: "ours"]

    def host_us(fn, calls=2000):
        order.append(fn())
        return next(times[order[-1]])

    monkeypatch.setattr(overhead, "host_us", host_us)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    assert overhead.interleaved_host_us(fns, 3) == [6.0, 7.0]
    assert order == ["torch", "ours", "ours", "torch", "torch", "ours"]


def test_overhead_settle_rounds_are_not_counted(monkeypatch):
    """--settle: untimed rounds of every function until that many seconds have passed, then the timed rounds,
    whose medians alone are reported."""
    import torch

    from bench import overhead

    clock = iter([0.0, 0.5, 1.2])  # the settle's end is set at 0.0 + 1.0; one untimed round runs, then it stops
    monkeypatch.setattr(overhead.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    times = {"torch": iter([100.0, 5.0, 9.0, 6.0]), "ours": iter([100.0, 8.0, 7.0, 1.0])}
    fns = [lambda: "torch", lambda: "ours"]
    monkeypatch.setattr(overhead, "host_us", lambda fn, calls=2000: next(times[fn()]))
    assert overhead.interleaved_host_us(fns, 3, settle_s=1.0) == [6.0, 7.0]
    assert all(next(t, None) is None for t in times.values()), "one settle round and three timed ones"


def test_overhead_times_every_dtype_in_the_same_rounds(monkeypatch, capsys, tmp_path):
    """bench.overhead --dtype a b: one set of interleaved rounds holds every dtype's functions (so that the process's
    drift in host speed falls on all alike), each dtype's row reports its own eleven host times (the seventh: an
    autograd.Function that launches nothing; the eighth and the last: inside patch_torch(); the last three: the C++
    launch path, timed with it on), and summary.md starts with the command and holds the table."""
    import torch
    from synthetic_devices import SM90

    from bench import overhead
    from tritonsoftmax import device

    rounds_of, settles, paths_of = [], [], []

    def interleaved(fns, rounds, settle_s, paths=None):
        rounds_of.append(len(fns))
        settles.append(settle_s)
        paths_of.append(paths)
        return [float(i) for i in range(len(fns))]

    monkeypatch.setattr(overhead, "interleaved_host_us", interleaved)
    monkeypatch.setattr(overhead, "native_available", lambda: True)
    monkeypatch.setattr(overhead, "graph_us", lambda fn: 99.0)
    monkeypatch.setattr(overhead, "native_fallbacks", lambda step, steps, patched: f"{int(patched)}/{steps}")
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None: torch.empty(0, dtype=dtype))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda dev=None: SM90)
    args = ["--shapes", "8x2048", "32x8192", "--dtype", "float32", "bfloat16", "--out", str(tmp_path)]
    assert overhead.main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8×2048")]
    assert rounds_of == [22, 22], "every dtype's eleven functions in one set of rounds, per shape"
    one = [(False, False)] * 7 + [(False, True), (True, False), (True, False), (True, True)]
    assert paths_of[0] == one * 2, "(C++ launch path, inside patch_torch()) by column"
    assert settles == [3.0, 0.0], "untimed rounds before the first shape only"
    assert rows == ["| 8×2048 | float32 | " + " | ".join(f"{float(i)}" for i in range(11)) + " | 99.0 | 99.0 "
                    "| 0/20 | 1/20 |",
                    "| 8×2048 | bfloat16 | " + " | ".join(f"{float(i)}" for i in range(11, 22)) + " | 99.0 "
                    "| 99.0 | 0/20 | 1/20 |"]
    assert "steps of 20 through Python (fwd/bwd) |" in (tmp_path / "summary.md").read_text()
    assert "C++ launch path: ours fwd+bwd inside patch_torch() host µs" in (tmp_path / "summary.md").read_text()
    assert "empty autograd.Function fwd+bwd host µs" in (tmp_path / "summary.md").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith(f"Command: `python -m bench.overhead {' '.join(args)}`")
    assert all(row in summary for row in rows) and "NVIDIA H200" in summary
    assert summary.count(f" / {os.cpu_count()}") == 2, "the host's load at the start and the end"


def test_baseline_copy_renames_the_package_its_operators_and_its_variables():
    """bench.baseline's rewrite: the copy imports itself as tritonsoftmax_base, registers tritonsoftmax_base::*
    and reads TRITONSOFTMAX_BASE_*, so the package under test and the copy share one process without colliding."""
    from bench.baseline import rewrite

    src = ('from tritonsoftmax.device import x\n@torch.library.custom_op("tritonsoftmax::softmax")\n'
           'os.environ.get("TRITONSOFTMAX_AUTOTUNE")\nfiles("tritonsoftmax.tune_cache")\nimport tritonsoftmax\n'
           'tritonsoftmax_extra = 1\n')
    assert rewrite(src) == ('from tritonsoftmax_base.device import x\n'
                            '@torch.library.custom_op("tritonsoftmax_base::softmax")\n'
                            'os.environ.get("TRITONSOFTMAX_BASE_AUTOTUNE")\nfiles("tritonsoftmax_base.tune_cache")\n'
                            'import tritonsoftmax_base\ntritonsoftmax_extra = 1\n')


def test_a_folder_of_both_directions_gets_a_table_and_a_plot_for_each_with_the_ratio(tmp_path):
    """The every-n suite holds forward and backward parts: the same (plot, dtype, shape) measured both ways stays
    two points, each direction gets its own table (with the vs-best digest over ten points or more) and files."""
    import json

    from bench.report import latest_points, plot_all, write_summary

    def part(name, mode, seq, auto):
        meta = {"command": f"python -m bench.sweep --preset every-n --mode {mode}", "device": "GPU", "torch": "2",
                "triton": "3", "repeats": 3, "rep_ms": 30.0, "interpreter": False, "autotune": "0", "skipped": {},
                "seq": seq, "timer": "kernel", "mode": mode}
        pts = [{"plot": "every-n-m4096", "dtype": "bfloat16", "M": 4096, "N": n,
                "gbps": {"auto": auto * (0.9 if n == 1152 else 1.0), "quack": 100.0}} for n in range(64, 1281, 64)]
        (tmp_path / f"points-{name}.json").write_text(json.dumps({"meta": meta, "points": pts}))

    part("fwd", "fwd", 1, 101.0)
    part("bwd", "bwd", 2, 99.0)
    assert len(latest_points(tmp_path)) == 40
    text = write_summary(tmp_path)
    assert "## every-n-m4096, bfloat16, forward" in text and "## every-n-m4096, bfloat16, backward" in text
    assert "vs best: 19 of 20 points at 0.97 or more; median 1.01, worst 0.91 (4096×1152)." in text
    assert "vs best: 0 of 20 points at 0.97 or more; median 0.99, worst 0.89 (4096×1152)." not in text
    assert "| 4096×1152 | 89 | 100 | QuACK 100 | 0.89 | 2 |" in text
    pngs = plot_all(tmp_path, {"every-n-m4096": {"x": "N"}})
    assert sorted(p.name for p in pngs) == ["every-n-m4096-bfloat16-bwd.png", "every-n-m4096-bfloat16-fwd.png"]
    assert (tmp_path / "every-n-m4096-bfloat16-bwd.csv").is_file()


def test_every_n_grid_covers_fine_lengths_and_sample_slices_it():
    from bench import sweep

    lengths = set(sweep.EVERY_N_LENGTHS)
    assert set(range(64, 16385, 64)) <= lengths, "every multiple of 64 up to 16K"
    assert {1023, 1025, 4097, 16385, 50257} <= lengths and max(lengths) == 2**23 + 1
    long = sorted(n for n in lengths if n > 16384 and n % 64 == 0)
    assert all(b / a < 1.1 for a, b in zip(long, long[1:], strict=False)), "eight an octave, rounded to 64"
    for m, spec in ((m, sweep.EVERY_N_PLOTS[f"every-n-m{m}"]) for m in sweep.EVERY_N_ROWS):
        assert all(mm == m and mm * n <= sweep.EVERY_N_MAX_ELEMENTS for mm, n in spec["shapes"])
    assert sweep.main(["--preset", "every-n", "--sample", "3/3"]) == 2


def test_tutorial_provider_sizes_its_grid_from_registers_as_the_tutorial_does():
    from bench.peers import tutorial_programs

    h200 = {"max_num_regs": 65536, "warpSize": 32, "max_shared_mem": 232448, "multiprocessor_count": 132}
    assert tutorial_programs(4096, 32, 0, h200) == 132 * 8, "32 registers x 8 warps: 8 programs an SM"
    assert tutorial_programs(4096, 128, 0, h200) == 132 * 2
    assert tutorial_programs(4096, 32, 100000, h200) == 132 * 2, "shared memory bounds it too"
    assert tutorial_programs(100, 32, 0, h200) == 100, "never more programs than rows"


def test_sampling_providers_divide_by_one_temperature_a_row():
    """The sampling plot's lines: ours with the reciprocals as its per-row scale, torch and the naive version on
    x / t; the peers without a per-row temperature sit it out."""
    import torch
    from conftest import DEVICE

    from bench import peers

    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    t = torch.tensor([[0.5], [1.0], [1.5]], device=DEVICE)
    want = torch.softmax(x.double() / t.double(), -1)
    for name in ("auto", "coop", "torch", "naive"):
        got = peers.prepare_sampling(name, x, t)()
        assert (got.double() - want).abs().max().item() <= 1e-6, name
    for name in ("liger", "quack", "smem", "previous"):
        with pytest.raises(peers.Unavailable, match="temperature|one scale"):
            peers.prepare_sampling(name, x, t)


def test_overhead_empty_function_records_and_backpropagates_like_ours():
    """bench.overhead's floor line: the empty autograd.Function takes our forward's arguments, is recorded by
    autograd and gives a gradient of the input's shape and dtype, through the same grad_step the other lines use."""
    import torch

    from bench import overhead

    x, dy = torch.randn(3, 5), torch.randn(3, 5)
    fns = overhead.host_functions(x, dy)
    (grad,) = fns["empty autograd.Function fwd+bwd"]()
    assert grad.shape == x.shape and grad.dtype == x.dtype
    y = overhead.EmptyFunction.apply(x.requires_grad_(), -1, None, "auto", 1.0, False, False)
    assert y.grad_fn is not None and y.shape == x.shape


def test_overhead_counts_the_steps_that_fell_back_to_python(monkeypatch):
    """bench.overhead's fallback column: the C++ path's plan misses over the counted steps, forward and backward
    apart, with the path on (and inside patch_torch() where asked) while they run and off after."""
    import torch

    from bench import overhead
    from tritonsoftmax import native

    counts = {"forward": 0, "backward": 0, "forward_misses": 5, "backward_misses": 7}
    switched = []

    @contextlib.contextmanager
    def path(native_on, patched):
        switched.append((native_on, patched))
        yield
        switched.append("off")

    monkeypatch.setattr(native, "counts", lambda: dict(counts))
    monkeypatch.setattr(overhead, "launch_path", path)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def step():  # every backward misses, the forward has its plan
        counts["forward"] += 1
        counts["backward_misses"] += 1

    assert overhead.native_fallbacks(step, 20) == "0/20"
    assert switched == [(True, False), "off"]
    assert overhead.native_fallbacks(step, 3, patched=True) == "0/3" and switched[2:] == [(True, True), "off"]


def test_merge_adopts_parts_run_elsewhere_after_the_folders_own(tmp_path):
    """bench.sweep --merge A B --out DIR: the parts of A then B (each measured in a fresh folder, so each numbered
    from 1) join DIR's after its own, in that order, so a point measured again shows the last measurement; a part of
    the same name is replaced; a folder without parts is refused."""
    import json

    from bench import sweep
    from bench.report import latest_points, parts

    def part(folder, name, seq, gbps):
        folder.mkdir(exist_ok=True)
        meta = {"command": f"python -m bench.sweep {name}", "device": "GPU", "torch": "2", "triton": "3",
                "repeats": 3, "rep_ms": 30.0, "interpreter": False, "autotune": "0", "skipped": {}, "seq": seq,
                "mode": "fwd"}
        pts = [{"plot": "design", "dtype": "float32", "M": 8, "N": 2048, "gbps": {"auto": gbps, "liger": 68.0}}]
        (folder / f"points-{name}.json").write_text(json.dumps({"meta": meta, "points": pts}))

    out, a, b = tmp_path / "suite", tmp_path / "a", tmp_path / "b"
    part(out, "old", 1, 50.0)
    part(out, "older", 2, 60.0)
    part(a, "first", 1, 70.0)
    part(b, "second", 1, 80.0)
    part(b, "older", 2, 90.0)  # measured again elsewhere: replaces the folder's own part of that name
    assert sweep.main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    order = [p["meta"]["command"].split()[-1] for p in parts(out)]
    assert order == ["old", "first", "second", "older"]
    assert [p["meta"]["seq"] for p in parts(out)] == [1, 3, 4, 5]
    (point,) = latest_points(out)
    assert point["gbps"]["auto"] == 90.0 and point["run"] == 4
    assert "| 8×2048 |" in (out / "summary.md").read_text()
    assert sweep.main(["--merge", str(tmp_path / "empty"), "--out", str(out)]) == 2

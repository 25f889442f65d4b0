"""The public softmax: dims, layouts, dtypes, special values, empty tensors and bad input."""

import pytest
import torch
from conftest import DEVICE
from softmax_ref import assert_softmax_close, random_input

import tritonsoftmax
from tritonsoftmax.kernels import FAMILY_NAMES

IMPLS = ("auto",) + FAMILY_NAMES


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_3d_each_dim(dim, impl):
    x = random_input((5, 33, 7), torch.float32, DEVICE, seed=dim + 10)
    y = tritonsoftmax.softmax(x, dim, impl=impl)
    assert_softmax_close(y, x, dim)
    assert y.is_contiguous(), "output keeps the input's (contiguous) layout, like torch"


@pytest.mark.parametrize("impl", IMPLS)
def test_transposed_input(impl):
    x = random_input((40, 30), torch.float32, DEVICE).t()
    for dim in (0, 1):
        assert_softmax_close(tritonsoftmax.softmax(x, dim, impl=impl), x, dim)


@pytest.mark.parametrize("impl", IMPLS)
def test_sliced_rows_and_columns(impl):
    base = random_input((20, 500), torch.float16, DEVICE)
    for x in (base[::3], base[:, 7:407], base[2:9, ::2]):
        assert_softmax_close(tritonsoftmax.softmax(x, impl=impl), x)


def _spy_launches(monkeypatch) -> dict:
    """Record the input pointer and RowProblem of the next kernel launch through the API."""
    from tritonsoftmax.kernels.launches import PreparedLaunch

    seen = {}
    real = PreparedLaunch.__call__

    def spy(self, x, y, *extra):
        seen["ptr"], seen["problem"] = x.data_ptr(), self.problem
        return real(self, x, y, *extra)

    monkeypatch.setattr(PreparedLaunch, "__call__", spy)
    return seen


def test_row_stride_slice_makes_no_copy(monkeypatch):
    seen = _spy_launches(monkeypatch)
    base = random_input((10, 64), torch.float32, DEVICE)
    x = base[:, :50]
    assert_softmax_close(tritonsoftmax.softmax(x), x)
    assert seen["ptr"] == x.data_ptr(), "the kernel must read the slice in place"
    assert seen["problem"].x.outer == 64 and seen["problem"].x.col == 1


def test_middle_dim_makes_no_copy(monkeypatch):
    seen = _spy_launches(monkeypatch)
    x = random_input((4, 9, 6), torch.float32, DEVICE)
    assert_softmax_close(tritonsoftmax.softmax(x, 1), x, 1)
    assert seen["ptr"] == x.data_ptr()
    assert seen["problem"].inner == 6 and seen["problem"].x.col == 6


def test_layout_that_does_not_collapse_is_copied_and_correct():
    x = random_input((3, 4, 5, 6), torch.float32, DEVICE).permute(2, 0, 3, 1)
    for dim in range(4):
        assert_softmax_close(tritonsoftmax.softmax(x, dim), x, dim)


def test_expanded_input_with_zero_strides():
    x = random_input((1, 50), torch.float32, DEVICE).expand(4, 50)
    assert_softmax_close(tritonsoftmax.softmax(x), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_values_up_to_1e4(impl, dtype):
    x = random_input((4, 3000), torch.float32, DEVICE, scale=1.0)
    x = (x / x.abs().max() * 1e4).to(dtype)
    assert_softmax_close(tritonsoftmax.softmax(x, impl=impl), x)


@pytest.mark.parametrize("impl", IMPLS)
def test_inf_nan_and_all_neg_inf_rows_match_torch(impl):
    x = random_input((5, 300), torch.float32, DEVICE)
    x[0, 5] = float("inf")
    x[1, 17] = float("nan")
    x[2] = float("-inf")
    x[3, :250] = float("-inf")
    y = tritonsoftmax.softmax(x, impl=impl)
    assert_softmax_close(y, x)
    assert y[0].isnan().all() and y[1].isnan().all() and y[2].isnan().all()
    assert not y[3].isnan().any() and not y[4].isnan().any()


@pytest.mark.parametrize("shape,dim", [((0, 5), -1), ((5, 0), -1), ((5, 0), 0), ((2, 0, 3), 1)])
def test_empty_tensors(shape, dim):
    x = torch.empty(shape, device=DEVICE)
    y = tritonsoftmax.softmax(x, dim)
    assert y.shape == x.shape and y.dtype == x.dtype


def test_scalar_and_single_element():
    x = torch.tensor(3.0, device=DEVICE)
    assert tritonsoftmax.softmax(x).item() == 1.0
    x1 = random_input((7, 1), torch.float16, DEVICE)
    assert (tritonsoftmax.softmax(x1) == 1).all()


def test_float64_falls_back_to_torch():
    x = random_input((3, 100), torch.float64, DEVICE)
    torch.testing.assert_close(tritonsoftmax.softmax(x), torch.softmax(x, -1), rtol=0, atol=0)


def test_integer_input_with_dtype_is_cast_first():
    x = torch.randint(-5, 5, (4, 37), device=DEVICE)
    y = tritonsoftmax.softmax(x, dtype=torch.float32)
    assert_softmax_close(y, x.float())


def test_half_input_with_float32_dtype_gives_float32():
    x = random_input((4, 100), torch.float16, DEVICE)
    y = tritonsoftmax.softmax(x, dtype=torch.float32)
    assert y.dtype == torch.float32
    assert_softmax_close(y, x, out_dtype=torch.float32)


def test_integer_input_raises_type_error():
    with pytest.raises(TypeError, match="int64"):
        tritonsoftmax.softmax(torch.arange(6, device=DEVICE))


def test_bool_input_raises_type_error():
    with pytest.raises(TypeError, match="bool"):
        tritonsoftmax.softmax(torch.ones(3, dtype=torch.bool, device=DEVICE))


def test_complex_input_raises_type_error():
    with pytest.raises(TypeError, match="complex"):
        tritonsoftmax.softmax(torch.ones(3, dtype=torch.complex64, device=DEVICE), dtype=torch.float32)


def test_non_floating_dtype_argument_raises_type_error():
    with pytest.raises(TypeError, match="dtype"):
        tritonsoftmax.softmax(torch.ones(3, device=DEVICE), dtype=torch.int32)


@pytest.mark.parametrize("dim", [2, -3, 5])
def test_dim_out_of_range_raises_index_error_like_torch(dim):
    x = torch.ones(2, 3, device=DEVICE)
    with pytest.raises(IndexError) as ours:
        tritonsoftmax.softmax(x, dim)
    with pytest.raises(IndexError) as theirs:
        torch.softmax(x, dim)
    assert str(ours.value) == str(theirs.value)


def test_unknown_impl_raises_value_error_listing_choices():
    with pytest.raises(ValueError, match="'fused'.*'tile'.*'online'"):
        tritonsoftmax.softmax(torch.ones(2, 3, device=DEVICE), impl="fast")


def test_non_tensor_raises_type_error():
    with pytest.raises(TypeError, match="Tensor"):
        tritonsoftmax.softmax([1.0, 2.0])


def test_cpu_tensor_without_interpreter_uses_torch(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from tritonsoftmax.kernels.launches import PreparedLaunch

    monkeypatch.setattr(PreparedLaunch, "__call__", lambda *a, **k: pytest.fail("a kernel ran for a CPU tensor"))
    x = torch.randn(3, 10)
    torch.testing.assert_close(tritonsoftmax.softmax(x), torch.softmax(x, -1))


def test_warm_call_reuses_the_prepared_launch_and_stays_correct():
    from tritonsoftmax import execute

    x = random_input((6, 700), torch.float32, DEVICE, seed=1)
    first = tritonsoftmax.softmax(x, impl="online")
    key = execute._signature(x, -1, None, "online", False, False)
    if DEVICE == "cpu":
        assert key not in execute._prepared, "under the interpreter every call takes the cold path"
    else:
        assert key in execute._prepared
    for seed in (2, 3):  # fresh values, same signature
        x2 = random_input((6, 700), torch.float32, DEVICE, seed=seed)
        assert_softmax_close(tritonsoftmax.softmax(x2, impl="online"), x2)
    assert_softmax_close(first, x)


def test_warm_call_with_misaligned_pointer_is_still_correct():
    base = random_input((1, 8 * 64 + 1), torch.float32, DEVICE)
    aligned = base[0, :512].view(8, 64)
    shifted = base[0, 1:513].view(8, 64)  # 4-byte offset: not 16-byte aligned
    for x in (aligned, shifted, aligned, shifted):
        assert_softmax_close(tritonsoftmax.softmax(x), x)


def test_raw_args_pass_addresses_and_flag_a_misaligned_extra_tensor():
    """The warm path hands Triton's launcher addresses; any tensor argument off 16 bytes (the
    saved output of a backward too, not only x and y) sends the call back through Triton."""
    from tritonsoftmax.kernels.triton_launcher import raw_args

    base = torch.zeros(64)
    assert base.data_ptr() % 16 == 0
    x, y, odd = base[:16], base[16:32], base[1:17]
    args, aligned = raw_args(x, y, (odd, 0.5))
    assert args == [x.data_ptr(), y.data_ptr(), odd.data_ptr(), 0.5] and not aligned
    assert raw_args(x, y, (y, 0.5)) == ([x.data_ptr(), y.data_ptr(), y.data_ptr(), 0.5], True)
    assert not raw_args(odd, y, ())[1]


def test_warm_path_passes_every_constexpr_including_defaults():
    """A compiled kernel's launcher takes every constexpr; a config that leaves fused's STAGES and
    PER_SM to their defaults must still pass them (found on the H200: 31 arguments for 33)."""
    from tritonsoftmax.config import LaunchConfig
    from tritonsoftmax.kernels import fused, triton_launcher

    plain = LaunchConfig.make(4, BLOCK_N=1024, ROWS=2)
    flags = {"LOG": 0, "ZERO_MASKED": 1}
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, {**dict(plain.meta), **flags}) == (
        0, 1, 1024, 2, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0)
    piped = LaunchConfig.make(16, BLOCK_N=16384, ROWS=1, STAGES=3, PER_SM=1)
    flags["ALIGN"] = 8
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, {**dict(piped.meta), **flags}) == (
        0, 1, 16384, 1, 3, 1, 8, 1, 0, 0, 0, 0, 0, 0, 0)
    flags.update(ALIGN=1, VEC=4, TAIL=8)
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, {**dict(plain.meta), **flags})[-9:] == (
        1, 4, 8, 0, 0, 0, 0, 0, 0)
    wide = {**dict(plain.with_meta(I32=1).meta), **flags}
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, wide)[-6:] == (1, 0, 0, 0, 0, 0)
    held = {**dict(plain.with_meta(HELD=1).meta), **flags}
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, held)[-5:] == (1, 0, 0, 0, 0)
    quarters = {**dict(plain.with_meta(HELD=2).meta), **flags, "MID": 512}
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, quarters)[-5:] == (2, 0, 512, 0, 0)
    flags["ROW_SCALE"] = 1
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, {**dict(plain.meta), **flags})[-4:] == (1, 0, 0, 0)
    folded = {**dict(plain.meta), **flags, "FOLD": 1, "WHOLE": 1}
    assert triton_launcher.constexpr_values(fused.FAMILY.kernel, folded)[-2:] == (1, 1)


def _fake_launcher(call, **attrs):
    """An object of a class named CudaLauncher with ``call`` as its __call__ (layout detection only)."""
    cls = type("CudaLauncher", (), {"__call__": call})
    obj = cls()
    obj.__dict__.update({"launch": print, "global_scratch_size": 0, "profile_scratch_size": 0, **attrs})
    return obj


def call_36(self, gridX, gridY, gridZ, stream, function, *args):
    """CudaLauncher.__call__'s parameters in triton 3.6."""


def call_37(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
            launch_exit_hook, *args):
    """CudaLauncher.__call__'s parameters in triton 3.7-3.9."""


def test_c_launch_layout_recognises_each_triton_launcher_and_refuses_the_rest():
    from tritonsoftmax.kernels import triton_launcher

    tuple_attrs = {"arg_annotations": (), "kernel_signature": b""}
    assert triton_launcher.c_launch_layout(_fake_launcher(call_36)) == triton_launcher.C_LAUNCH_SPREAD
    assert triton_launcher.c_launch_layout(_fake_launcher(call_37, **tuple_attrs)) == triton_launcher.C_LAUNCH_TUPLE
    refused = [_fake_launcher(call_37),  # 3.7 parameters without the annotations it needs
               _fake_launcher(call_36, global_scratch_size=128),  # the wrapper would allocate scratch
               _fake_launcher(call_37, profile_scratch_size=64, **tuple_attrs),
               _fake_launcher(call_37, gsan_enabled=True, **tuple_attrs),
               _fake_launcher(lambda self, *args: None),
               object()]
    assert all(triton_launcher.c_launch_layout(r) == triton_launcher.RUN_LAUNCHER for r in refused)


def test_warm_launcher_passes_each_launcher_layout_its_arguments_in_order():
    """What a warm call hands Triton's C launch function (3.6: spread; 3.7-3.9: the kernel arguments
    as one tuple after their annotations), and the launcher itself when its layout is not known."""
    from tritonsoftmax.kernels import triton_launcher

    calls = []
    hooks = {"launch": lambda *a: calls.append(a), "launch_cooperative_grid": False, "launch_pdl": True}
    packed, fixed, kernel_args = (4, 1, 0), (7, 8), [11, 12, 0.5]
    stream = {3: 1003}.__getitem__  # device index -> its current stream

    start = triton_launcher.warm_launcher(_fake_launcher(call_36, **hooks), (5, 2, 1), 42, packed, fixed, stream, 3)
    start(*kernel_args)
    assert start.layout == triton_launcher.C_LAUNCH_SPREAD
    assert calls.pop() == (5, 2, 1, 1003, 42, False, True, None, None, packed, None, None, None, 11, 12, 0.5, 7, 8)

    run = _fake_launcher(call_37, arg_annotations=("ann",), kernel_signature=b"sig", **hooks)
    start = triton_launcher.warm_launcher(run, (5, 2, 1), 42, packed, fixed, stream, 3)
    start(*kernel_args)
    assert start.layout == triton_launcher.C_LAUNCH_TUPLE
    assert calls.pop() == (5, 2, 1, 1003, 42, False, True, packed, None, None, None, None, None, ("ann",), b"sig",
                           (11, 12, 0.5, 7, 8))

    refused = _fake_launcher(lambda self, *a: calls.append(("run", *a)), **hooks)
    start = triton_launcher.warm_launcher(refused, (5, 2, 1), 42, packed, fixed, stream, 3)
    start(*kernel_args)
    assert start.layout == triton_launcher.RUN_LAUNCHER
    assert calls.pop() == ("run", 5, 2, 1, 1003, 42, packed, None, None, None, 11, 12, 0.5, 7, 8)
    assert not calls


def test_direct_start_takes_the_common_warm_call_and_hands_the_rest_to_the_launch():
    """direct_start: (x, y, float scale) on the compiled alignment with no launch hook installed starts
    the kernel with the addresses; a misaligned pointer, a tensor among the extras, a non-float scale
    or an installed hook go to the full call (the PreparedLaunch's own __call__)."""
    from triton import knobs

    from tritonsoftmax.kernels import triton_launcher

    started, full = [], []
    x, y, saved = torch.zeros(64), torch.zeros(64), torch.zeros(64)
    direct = triton_launcher.direct_start(lambda *a: started.append(a), True, lambda *a: full.append(a))
    direct(x, y, 0.5)
    assert started.pop() == (x.data_ptr(), y.data_ptr(), 0.5) and not full
    for call in ((x[1:], y[1:], 0.5), (x, y, saved, 0.5), (x, y, 1)):
        direct(*call)
        assert full.pop() == call and not started
    assert not triton_launcher.direct_start(lambda *a: started.append(a), False, lambda *a: full.append(a))(x, y, 0.5)
    assert full.pop() == (x, y, 0.5) and not started  # compiled for misaligned pointers: aligned ones go back
    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("this triton has no HookChain launch hooks")
    fn = lambda metadata: None  # noqa: E731
    hook.add(fn)
    try:
        direct(x, y, 0.5)
    finally:
        hook.remove(fn)
    assert full.pop() == (x, y, 0.5) and not started


def test_direct_start_with_a_tensor_takes_the_backward_call_and_hands_the_rest_to_the_launch():
    """direct_start(tensors=1): (x, y, t, float scale), every pointer on the compiled alignment, starts the kernel
    with the three addresses; a misaligned saved tensor, a missing or non-float scale, or a non-tensor go to the full
    call; a launch whose extras are neither form gets the full call itself."""
    from tritonsoftmax.kernels import triton_launcher

    started, full = [], []
    x, y, saved = torch.zeros(64), torch.zeros(64), torch.zeros(65)
    direct = triton_launcher.direct_start(lambda *a: started.append(a), True, lambda *a: full.append(a), tensors=1)
    direct(x, y, saved, 0.25)
    assert started.pop() == (x.data_ptr(), y.data_ptr(), saved.data_ptr(), 0.25) and not full
    for call in ((x, y, saved[1:], 0.25), (x, y, 0.25), (x, y, saved, 1), (x, y, 3.0, 0.25)):
        direct(*call)
        assert full.pop() == call and not started
    fallback = lambda *a: full.append(a)  # noqa: E731
    assert triton_launcher.direct_start(lambda *a: started.append(a), True, fallback, tensors=-1) is fallback


@pytest.mark.gpu
def test_warm_backward_starts_the_kernel_directly_and_stays_correct():
    """A second backward of one signature finds its prepared launch (keyed on dim as the caller gave it) and starts
    it in one frame; fresh values and an incoming gradient of other strides stay correct."""
    from tritonsoftmax import execute

    y = torch.softmax(random_input((8, 2048), torch.float32, DEVICE, seed=3), -1)
    for seed, transpose in ((4, False), (5, False), (6, True)):
        dy = random_input((8, 2048), torch.float32, DEVICE, seed=seed)
        if transpose:
            dy = dy.t().contiguous().t()  # column-major: copied to y's strides first
        dx = execute.backward(dy, y, -1, "auto", 1.0, False, torch.float32)
        ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
        assert (dx.double() - ref).abs().max().item() <= 1e-5
    start, _, prepared = execute._prepared[("bwd", y.shape, y.stride(), y.dtype, y.get_device(), -1, "auto", False)]
    assert start == getattr(prepared, "direct", prepared)
    if hasattr(prepared, "_warm") and prepared._warm is not None:
        assert start != prepared.__call__  # the one-frame start, not the launch's generic call


def test_c_launch_layout_of_the_installed_triton():
    """The installed Triton's own CudaLauncher class (3.6: spread arguments; 3.7-3.9: a tuple)."""
    import triton

    from tritonsoftmax.kernels import triton_launcher

    launcher_cls = pytest.importorskip("triton.backends.nvidia.driver").CudaLauncher
    run = object.__new__(launcher_cls)
    run.__dict__.update(launch=print, global_scratch_size=0, profile_scratch_size=0, gsan_enabled=False,
                        arg_annotations=(), kernel_signature=b"")
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    if (major, minor) == (3, 6):
        del run.arg_annotations, run.kernel_signature  # 3.6's launcher has neither
        assert triton_launcher.c_launch_layout(run) == triton_launcher.C_LAUNCH_SPREAD
    elif (3, 7) <= (major, minor) <= (3, 9):
        assert triton_launcher.c_launch_layout(run) == triton_launcher.C_LAUNCH_TUPLE
    else:
        pytest.skip(f"triton {triton.__version__}: layouts are checked for 3.6-3.9 only")


@pytest.mark.needs("cuda_launcher")
@pytest.mark.gpu
def test_warm_call_starts_the_kernel_through_the_c_launch_function():
    from tritonsoftmax import execute
    from tritonsoftmax.kernels import triton_launcher

    x = random_input((8, 2048), torch.float32, DEVICE, seed=3)
    tritonsoftmax.softmax(x)
    start, _, prepared = execute._prepared[execute._signature(x, -1, None, "auto", False, False)]
    assert start == prepared.direct and start != prepared.__call__  # the warm call's one-frame start
    assert prepared._warm.layout in (triton_launcher.C_LAUNCH_SPREAD, triton_launcher.C_LAUNCH_TUPLE)
    for seed in (4, 5):
        x2 = random_input((8, 2048), torch.float32, DEVICE, seed=seed)
        assert_softmax_close(tritonsoftmax.softmax(x2), x2)


def test_warm_backward_with_a_misaligned_saved_output_is_still_correct():
    from tritonsoftmax import execute

    base = random_input((1, 8 * 64 + 1), torch.float32, DEVICE, seed=5)
    dy = random_input((8, 64), torch.float32, DEVICE, seed=6)
    for offset in (0, 1, 0, 1):
        y = torch.softmax(base[0, offset:offset + 512].view(8, 64), -1)
        storage = torch.empty(8 * 64 + 1, device=DEVICE)
        saved = storage[offset:offset + 512].view(8, 64).copy_(y)  # 4-byte offset when offset == 1
        dx = execute.backward(dy, saved, -1, "auto", 1.0, False, torch.float32)
        ref = y.double() * (dy.double() - (dy.double() * y.double()).sum(-1, keepdim=True))
        assert (dx.double() - ref).abs().max().item() <= 1e-5

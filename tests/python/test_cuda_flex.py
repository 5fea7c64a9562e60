"""ctorch.torch.flex_attention / create_block_mask on CUDA tensors (ct_device_flex_attention_*
through libctorch_cuda.so) against PyTorch's own flex_attention on the same GPU, compiled as a
user would (torch.compile(flex_attention)), forward and every gradient.

The GPU tests need a CUDA GPU, a CUDA build of PyTorch and libctorch_cuda.so: elsewhere each
says SKIPPED and why (they run on a lent GPU machine, scripts/test-cuda.sh). The tests at the
end run everywhere: CPU tensors keep the CPU path (against PyTorch's CPU flex_attention), and
CUDA tensors without ctorch's CUDA backend are refused by name before any work."""
import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ctorch
import ctorch.torch as ct
from ctorch.torch import attention as cta


def _why_not():
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    line = ctorch.lib.ct_cuda_describe()
    line = line.decode() if isinstance(line, bytes) else str(line)
    if "not loaded" in line or "no usable GPU" in line:
        return line
    return None


WHY = _why_not()
gpu = pytest.mark.skipif(WHY is not None, reason=f"SKIPPED: {WHY}")


# ---- the cases: ctorch's mods and the same ones written for PyTorch --------------------------

def _docs(B, L, device):
    lens = [23, 9, 5, 41, 17]
    ids = torch.empty(B, L, dtype=torch.int32)
    for b in range(B):
        t, d = 0, 0
        while t < L:
            n = lens[(d + b) % 5]
            ids[b, t:t + n] = d
            t, d = t + n, d + 1
    return ids.to(device)


def _case(name, B, L, dev):
    """(ctorch mask_mod or None, torch mask_mod or None, ctorch score_mod, torch score_mod)."""
    if name == "causal":
        return ct.mask_mods.causal(), lambda b, h, q, kv: q >= kv, None, None
    if name == "window":
        return (ct.mask_mods.sliding_window(20), lambda b, h, q, kv: (q >= kv) & (q - kv <= 20), None, None)
    if name == "two-sided window":
        return (ct.mask_mods.sliding_window(9, causal=False), lambda b, h, q, kv: (q - kv).abs() <= 9, None, None)
    if name == "documents":
        ids = _docs(B, L, dev)
        m = ct.and_masks(ct.mask_mods.causal(), ct.mask_mods.document(ids))
        return m, lambda b, h, q, kv: (q >= kv) & (ids[b, q] == ids[b, kv]), None, None
    if name == "prefix":
        return ct.mask_mods.prefix_lm(30), lambda b, h, q, kv: (kv < 30) | (q >= kv), None, None
    if name == "softcap":
        return (ct.mask_mods.causal(), lambda b, h, q, kv: q >= kv, ct.score_mods.softcap(2.5),
                lambda s, b, h, q, kv: 2.5 * torch.tanh(s / 2.5))
    if name == "alibi":
        sl = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=dev)
        return (None, None, ct.score_mods.alibi(slopes=sl.tolist()),
                lambda s, b, h, q, kv: s + sl[h] * (kv - q).to(s.dtype))
    raise AssertionError(name)


@functools.lru_cache(maxsize=None)
def _torch_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


CASES = [  # name, B, Hq, Hkv, L, E
    ("causal", 2, 4, 4, 128, 64),
    ("causal", 1, 4, 2, 200, 64),          # GQA, odd length
    ("window", 1, 2, 2, 257, 32),
    ("two-sided window", 2, 2, 1, 96, 64),
    ("documents", 2, 4, 2, 131, 64),
    ("prefix", 1, 2, 2, 77, 128),
    ("softcap", 2, 2, 2, 100, 64),
    ("alibi", 1, 4, 4, 65, 64),
]


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,B,Hq,Hkv,L,E", CASES)
def test_matches_pytorch_flex_on_the_gpu(name, B, Hq, Hkv, L, E, dtype):
    from torch.nn.attention.flex_attention import create_block_mask as torch_bm
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, Hq, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    dout = torch.randn(B, Hq, L, E, device=dev, generator=g).to(dtype)
    cm, tm, cs, ts = _case(name, B, L, dev)
    bm = ct.create_block_mask(cm, B, Hq, L, L, device=dev) if cm is not None else None
    out, lse = ct.flex_attention(q, k, v, score_mod=cs, block_mask=bm, enable_gqa=Hq != Hkv, return_lse=True)
    assert out.device == q.device and out.dtype == dtype and lse.device == q.device
    out.backward(dout)
    # PyTorch's flex_attention on the same values in f32 (bf16 inputs upcast: the tighter reference)
    qr, kr, vr = (x.detach().float().requires_grad_() for x in (q, k, v))
    tbm = torch_bm(tm, B, Hq, L, L, device=dev) if tm is not None else None
    ref, rlse = _torch_flex()(qr, kr, vr, score_mod=ts, block_mask=tbm, enable_gqa=Hq != Hkv, return_lse=True)
    ref.backward(dout.float())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(lse, rlse.float(), rtol=1e-4, atol=1e-4 if dtype == torch.float32 else 2e-2)
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        assert got.device == q.device and got.dtype == dtype
        torch.testing.assert_close(got.float(), want, **tol)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_traced_mods_with_captured_cuda_tensors(dtype):
    """Python score_mod / mask_mod over captured CUDA tensors: traced and compiled (the
    captures read on the host), run in the GPU kernels; the table's gradient comes back on
    the GPU, as PyTorch's."""
    from torch.nn.attention.flex_attention import create_block_mask as torch_bm
    dev = "cuda"
    B, Hq, Hkv, L, E = 2, 4, 2, 150, 64
    g = torch.Generator(device=dev).manual_seed(3)
    q = torch.randn(B, Hq, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, L, E, device=dev, generator=g).to(dtype).requires_grad_()
    table = (0.1 * torch.randn(Hq, 2 * L - 1, device=dev, generator=g)).requires_grad_()
    ids = _docs(B, L, dev)

    def bias(s, b, h, qi, kv):
        return s + table[h, qi - kv + L - 1]

    def docs(b, h, qi, kv):
        return (qi >= kv) & (ids[b, qi] == ids[b, kv])

    bm = ct.create_block_mask(docs, B, None, L, L, device=dev)
    out = ct.flex_attention(q, k, v, score_mod=bias, block_mask=bm, enable_gqa=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert table.grad is not None and table.grad.device == table.device
    got_table = table.grad.clone()
    table.grad = None
    qr, kr, vr = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = _torch_flex()(qr, kr, vr, score_mod=bias, block_mask=torch_bm(docs, B, None, L, L, device=dev),
                        enable_gqa=True)
    ref.backward(dout.float())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), ref, **tol)
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad), (got_table, table.grad)):
        torch.testing.assert_close(got.float(), want, **tol)


@gpu
def test_bitwise_repeatable_and_mask_uploaded_once():
    dev = "cuda"
    B, H, L, E = 2, 4, 190, 64
    q, k, v = (torch.randn(B, H, L, E, device=dev, requires_grad=True) for _ in range(3))
    bm = ct.create_block_mask(ct.mask_mods.sliding_window(33), None, None, L, L, device=dev)
    assert len(bm._dev) == 1  # made at creation, for that GPU
    handle = next(iter(bm._dev.values())).value
    runs = []
    for _ in range(3):
        for x in (q, k, v):
            x.grad = None
        out = ct.flex_attention(q, k, v, block_mask=bm)
        out.sum().backward()
        runs.append([out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()])
    assert next(iter(bm._dev.values())).value == handle  # reused, not uploaded again
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))


@gpu
def test_cuda_refusals():
    dev = "cuda"
    q = torch.randn(1, 2, 64, 32, device=dev)
    with pytest.raises(RuntimeError, match="same device"):
        ct.flex_attention(q, q.cpu(), q)
    with pytest.raises(ctorch.CtorchError, match="L == S"):
        ct.flex_attention(q, torch.randn(1, 2, 80, 32, device=dev), torch.randn(1, 2, 80, 32, device=dev))
    bm = ct.create_block_mask(ct.or_masks(ct.mask_mods.causal(), ct.mask_mods.prefix_lm(3)), None, None, 64, 64)
    with pytest.raises(ctorch.CtorchError, match="ct_mask_mod_or"):
        ct.flex_attention(q, q, q, block_mask=bm)
    table = torch.zeros(2, 9, device=dev)
    with pytest.raises(ctorch.CtorchError, match="relative_bias"):
        ct.flex_attention(q, q, q, score_mod=ct.score_mods.relative_bias(table))


# ---- everywhere --------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", ["causal", "documents", "window"])
def test_cpu_tensors_keep_the_cpu_path(mask):
    """CPU tensors never reach the device layer: the results are PyTorch's CPU flex_attention's
    (forward: PyTorch has no CPU flex backward) and no device copy of the mask is made."""
    from torch.nn.attention.flex_attention import create_block_mask as torch_bm
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
    B, H, L, E = 2, 2, 75, 16
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, L, E, generator=g) for _ in range(3))
    cm, tm, _, _ = _case(mask, B, L, "cpu")
    bm = ct.create_block_mask(cm, B, H, L, L)
    out = ct.flex_attention(q, k, v, block_mask=bm)
    assert out.device.type == "cpu" and bm._dev == {}
    ref = torch_flex(q, k, v, block_mask=torch_bm(tm, B, H, L, L, device="cpu"))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


_NO_BACKEND = textwrap.dedent("""
    import torch, ctorch, ctorch.torch as ct

    class FakeCuda(torch.Tensor):
        # a CPU tensor that says it is on cuda:0: the call must stop before reading it
        @property
        def is_cuda(self):
            return True

        @property
        def device(self):
            return torch.device("cuda", 0)

    q = torch.randn(1, 2, 16, 8).as_subclass(FakeCuda)
    for call in (lambda: ct.flex_attention(q, q, q),
                 lambda: ct.create_block_mask(ct.mask_mods.causal(), None, None, 16, 16, device="cuda:0"),
                 lambda: ct.create_block_mask("causal", None, None, 16, 16).to("cuda:0")):
        try:
            call()
        except ctorch.CtorchError as e:
            print("REFUSED", e.status, str(e))
        else:
            print("NOT REFUSED")
""")


def test_cuda_tensors_without_the_cuda_backend_are_refused(tmp_path):
    """Without libctorch_cuda.so (CTORCH_CUDA_LIB names a missing file), flex_attention on a
    CUDA tensor and a block mask for a GPU fail with CtorchError naming the backend and why,
    before any data is read (the tensor is a CPU tensor posing as cuda:0)."""
    py = os.path.dirname(os.path.dirname(os.path.abspath(ctorch.__file__)))  # this ctorch package
    env = dict(os.environ, CTORCH_CUDA_LIB=str(tmp_path / "missing" / "libctorch_cuda.so"),
               PYTHONPATH=os.pathsep.join(filter(None, [py, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", _NO_BACKEND], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3, r.stdout + r.stderr
    for line in lines:
        assert line.startswith("REFUSED CT_EUNSUPPORTED"), line
        assert "needs ctorch's CUDA backend (libctorch_cuda.so" in line, line
        assert "missing" in line and "libctorch_cuda.so" in line, line


def test_block_mask_to_cpu_and_bad_device():
    bm = ct.create_block_mask("causal", None, None, 16, 16)
    assert bm.to("cpu") is bm and bm._dev == {}
    with pytest.raises(ValueError, match="CPU or CUDA"):
        bm.to("meta")
    assert cta.BlockMask.to.__doc__

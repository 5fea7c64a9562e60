"""Safetensors interop: files the safetensors library (0.8) writes, in every dtype it writes
(F8_E4M3, F8_E5M2, their FNUZ kinds, F8_E8M0, F4, U16/32/64 ...), load through ctorch with
identical bytes and values; files ctorch writes load with safetensors.torch.load_file,
safe_open and PyTorch 2.13's native torch.load; files from an independent writer (struct + json
+ numpy, from the specification) cover what the library never writes (F6, odd layouts)."""
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import safetensors.torch as stt
from safetensors import safe_open

import ctorch
from ctorch import io
from ctorch._lib import CtorchError

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
        "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F8_E4M3": 8,
        "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6,
        "F6_E3M2": 6}
NP = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
      "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32, "F64": np.float64,
      "I64": np.int64, "U64": np.uint64, "C64": np.complex64}


# ---- an independent writer and reader, from the specification --------------------------

def write_st(path, tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, raw bytes), laid out in the order given."""
    hdr, off, blobs = {}, 0, []
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    """Parse with struct + json and check the layout rules; returns (header, data, n)."""
    b = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", b[:8])
    raw = b[8:8 + n]
    hdr = json.loads(raw)
    meta = hdr.pop("__metadata__", None)
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in hdr.items())
    pos = 0
    for s, e, k in spans:
        assert s == pos, f"{k} not contiguous"
        nel = int(np.prod(hdr[k]["shape"], dtype=np.int64))
        assert e - s == nel * BITS[hdr[k]["dtype"]] // 8
        pos = e
    assert 8 + n + pos == len(b), "data buffer not covered exactly"
    return hdr, meta, b[8 + n:], raw


def rand_bytes(rng, n):
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def bf16_bits(x):
    """float32 -> bf16 bit patterns, rounding as torch does."""
    return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


# ---- load ------------------------------------------------------------------------------

def test_independent_writer_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    tensors = []
    for i, dt in enumerate(BITS):
        shape = [2, 4] if i % 3 else [1, 2, 4]
        nel = int(np.prod(shape))
        if dt in NP and dt != "BOOL":
            arr = (rng.standard_normal(nel) * 50).astype(NP[dt]).reshape(shape)
            raw = arr.astype(np.dtype(NP[dt]).newbyteorder("<")).tobytes()
        elif dt == "BOOL":
            raw = (rng.integers(0, 2, nel) > 0).astype(np.bool_).tobytes()
        elif dt == "BF16":
            raw = bf16_bits(rng.standard_normal(nel)).tobytes()
        else:
            raw = rand_bytes(rng, nel * BITS[dt] // 8)
        tensors.append((f"model.{dt.lower()}", dt, shape, raw))
    tensors.append(("scalar", "F64", [], struct.pack("<d", 2.5)))
    tensors.append(("empty", "F32", [0, 3], b""))
    # An unaligned order on purpose: U8 first puts everything after it at odd offsets.
    tensors.insert(0, ("first.byte", "U8", [3], b"\x01\x02\x03"))
    p = tmp_path / "indep.safetensors"
    write_st(p, tensors, {"format": "pt", "note": "caf\u00e9"})
    with io.SafetensorsFile(p) as f:
        assert f.format == "safetensors"
        assert f.keys() == [t[0] for t in tensors]  # file order == data order here
        assert f.metadata == {"format": "pt", "note": "caf\u00e9"}
        for name, dt, shape, raw in tensors:
            inf = f.info(name)
            assert inf["dtype"] == dt and inf["shape"] == list(shape) and inf["nbytes"] == len(raw)
            assert f.raw(name).tobytes() == raw  # identical bytes
            if dt in NP:
                a = f.numpy(name)
                assert a.shape == tuple(shape)
                assert a.tobytes() == np.frombuffer(raw, NP[dt]).tobytes()
                assert not a.flags.writeable
        # bf16 -> f32 through ctorch equals torch's conversion of the same bits
        raw = dict((t[0], t[3]) for t in tensors)["model.bf16"]
        want = torch.from_numpy(np.frombuffer(raw, np.int16).copy()).view(torch.bfloat16).float().numpy()
        assert np.array_equal(f.to("model.bf16", "f32").ravel(), want)
        f16 = np.frombuffer(raw and dict((t[0], t[3]) for t in tensors)["model.f16"], np.float16)
        assert np.array_equal(f.to("model.f16", "f32").ravel(), f16.astype(np.float32))
        assert f.to("scalar", "f32").shape == () and f.to("scalar", "f32") == 2.5
        assert f.numpy("empty").shape == (0, 3)
        with pytest.raises(TypeError):
            f.numpy("model.f4")
        with pytest.raises(CtorchError) as e:
            f.to("model.f4", "f32")
        assert e.value.status == "CT_EUNSUPPORTED"
        with pytest.raises(CtorchError) as e:
            f.info("nope")
        assert "nope" in str(e.value)


def test_f8_conversion_against_torch_rounding(tmp_path):
    """f32 -> bf16 / f16 / float8 (e4m3fn, e5m2) through ctorch are PyTorch 2.13's conversions bit
    for bit (rounding, saturation, NaN: e5m2's NaN was 0x7E where torch writes 0x7F), and the
    float8 bits read back to f32 as torch reads them."""
    x = np.linspace(-500, 500, 4001, dtype=np.float32)
    x = np.concatenate([x, np.array([np.nan, -np.nan, np.inf, -np.inf, 1e-9, -1e-9, 0.0, -0.0, 448, 464,
                                     465, 57344, 61440, 1e6, 2.0 ** -9, 2.0 ** -10, 2.0 ** -17], np.float32)])
    tx = torch.from_numpy(x)
    p = tmp_path / "f32.safetensors"
    write_st(p, [("x", "F32", [x.size], x.tobytes())])
    nan = np.isnan(x)
    with io.SafetensorsFile(p) as f:
        # torch's bf16 NaN bits vary with its code path (0xFFFF from the vector one): NaN stays NaN
        b = f.to("x", "bf16")
        assert np.array_equal(b[~nan], bf16_bits(x)[~nan])
        assert np.all(np.isnan(torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)[nan].float().numpy()))
        assert np.array_equal(f.to("x", "f16").view(np.uint16), tx.half().view(torch.int16).numpy().view(np.uint16))
        for name, dt in (("f8e4m3", torch.float8_e4m3fn), ("f8e5m2", torch.float8_e5m2)):
            got = f.to("x", name)
            assert got.dtype == np.uint8 and np.array_equal(got, tx.to(dt).view(torch.uint8).numpy()), name
    # every float8 bit pattern, read back to f32 as torch reads it
    bits = np.arange(256, dtype=np.uint8)
    p2 = tmp_path / "f8.safetensors"
    write_st(p2, [("e4", "F8_E4M3", [256], bits.tobytes()), ("e5", "F8_E5M2", [256], bits.tobytes())])
    with io.SafetensorsFile(p2) as f:
        for k, dt in (("e4", torch.float8_e4m3fn), ("e5", torch.float8_e5m2)):
            want = torch.from_numpy(bits.copy()).view(dt).float()
            torch.testing.assert_close(torch.from_numpy(np.array(f.to(k, "f32"))), want, rtol=0, atol=0,
                                       equal_nan=True)


def test_views_keep_the_file_alive(tmp_path):
    p = tmp_path / "v.safetensors"
    write_st(p, [("a", "F32", [4], np.arange(4, dtype=np.float32).tobytes())])
    f = io.SafetensorsFile(p)
    a = f.numpy("a")
    f.close()  # deferred while a lives
    assert a.tolist() == [0, 1, 2, 3]
    del a, f


# ---- the safetensors library as the oracle ----------------------------------------------

# Every dtype safetensors 0.8 writes from torch tensors (safetensors.torch), and its name.
LIB = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
       "BOOL": torch.bool, "C64": torch.complex64, "U16": torch.uint16, "U32": torch.uint32,
       "U64": torch.uint64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
       "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
       "F8_E8M0": torch.float8_e8m0fnu, "F4": torch.float4_e2m1fn_x2}
# the dtypes ctorch converts to f32 (so their values, not only their bits, are compared)
VALUES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


def lib_sample(st, shape, seed):
    g = torch.Generator().manual_seed(seed)
    dt = LIB[st]
    if dt.itemsize == 1 and st not in ("I8", "U8", "BOOL"):  # every float8 / float4 bit pattern
        return torch.randint(0, 256, shape, generator=g).to(torch.uint8).view(dt)
    if dt == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dt.is_complex or dt.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.complex64 if dt.is_complex else torch.float32)
                * 3).to(dt)
    return torch.randint(0 if st[0] == "U" else -1000, 1000, shape, generator=g).to(dt)


def tbytes(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def st_shape(st, t):
    """The shape safetensors records: F4 counts values, two a byte."""
    s = list(t.shape)
    return s[:-1] + [s[-1] * 2] if st == "F4" else s


def test_safetensors_library_writes_ctorch_reads(tmp_path):
    tensors = {f"m.{st.lower()}": lib_sample(st, (3, 8) if i % 2 else (2, 2, 4), i) for i, st in enumerate(LIB)}
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    tensors["empty"] = torch.zeros(0, 3)
    p = tmp_path / "lib.safetensors"
    stt.save_file(tensors, p, metadata={"format": "pt", "who": "safetensors"})
    kinds = {f"m.{st.lower()}": st for st in LIB}
    with io.SafetensorsFile(p) as f:
        assert f.format == "safetensors" and f.metadata == {"format": "pt", "who": "safetensors"}
        assert sorted(f.keys()) == sorted(tensors)
        for k, v in tensors.items():
            st = kinds[k] if k in kinds else {torch.float64: "F64", torch.float32: "F32"}[v.dtype]
            inf = f.info(k)
            assert inf["dtype"] == st and inf["shape"] == st_shape(st, v), k
            assert f.raw(k).tobytes() == tbytes(v), k  # identical bytes
            if st in VALUES:  # and the values, as torch converts them
                torch.testing.assert_close(torch.from_numpy(np.array(f.to(k, "f32"))), v.float(),
                                           rtol=0, atol=0, equal_nan=True, msg=k)
            if st in NP:
                assert np.array_equal(f.numpy(k), v.numpy())
    tensors2, meta = io.load(p)
    assert meta == {"format": "pt", "who": "safetensors"}
    for k, v in tensors.items():
        assert tensors2[k].tobytes() == tbytes(v)


def test_ctorch_writes_safetensors_library_and_torch_read(tmp_path):
    tensors = {f"m.{st.lower()}": lib_sample(st, (4, 6), 40 + i) for i, st in enumerate(LIB)}
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    tensors.update({"np.t": base.T, "np.step": base[::2, 1::3], "scalar": np.float64(7.5),
                    "empty": torch.zeros(0, 4), "param": torch.nn.Parameter(torch.ones(3))})
    p = tmp_path / "ct.safetensors"
    io.save(p, tensors, metadata={"step": "12", "who": "ctorch"})

    def check(got, how):
        assert set(got) == set(tensors), how
        for k, v in tensors.items():
            want = torch.from_numpy(np.array(v)) if isinstance(v, (np.ndarray, np.generic)) else v.detach()
            g = got[k]
            assert g.dtype == want.dtype and g.shape == want.shape, (how, k, g.dtype, g.shape)
            assert tbytes(g) == tbytes(want), (how, k)

    check(stt.load_file(p), "safetensors.torch.load_file")
    check(torch.load(p), "torch.load")  # PyTorch 2.13 reads safetensors natively
    check(torch.load(p, weights_only=True), "torch.load(weights_only=True)")
    with safe_open(p, framework="pt") as f:
        assert f.metadata() == {"step": "12", "who": "ctorch"}
        assert torch.equal(f.get_slice("np.t")[2:5, 1:4], torch.from_numpy(base.T[2:5, 1:4].copy()))
        assert torch.equal(f.get_tensor("m.bf16"), tensors["m.bf16"])


# ---- save --------------------------------------------------------------------------------

def test_ctorch_writes_independent_reader_and_numpy_read(tmp_path):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 10)).astype(np.float32)
    tensors = {
        "u8": np.arange(5, dtype=np.uint8),
        "w.f32": base,
        "w.t": base.T,                        # non-contiguous
        "w.step": base[::2, 1::3],            # stepped
        "f64": rng.standard_normal(3),
        "i64": np.array([-1, 2**40], dtype=np.int64),
        "f16": rng.standard_normal(7).astype(np.float16),
        "bool": np.array([True, False, True]),
        "u16": np.array([1, 65535], dtype=np.uint16),   # raw: no ctorch dtype
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.float32(7.5),
        "empty": np.zeros((0, 4), np.float32),
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "big.i32": np.arange(100000, dtype=np.int32).reshape(1000, 100)[:, ::-1],  # negative stride
    }
    p = tmp_path / "ct.safetensors"
    io.save(p, tensors, metadata={"step": 12, "who": "ctorch"})
    hdr, meta, data, raw = read_st(p)
    assert meta == {"step": "12", "who": "ctorch"}
    assert len(raw) % 8 == 0 and raw.rstrip(b" ").endswith(b"}") and len(raw) - len(raw.rstrip(b" ")) < 8
    assert raw.startswith(b'{"__metadata__"')
    # layout: descending element size, ties in the order given; every tensor aligned
    order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
    sizes = [BITS[hdr[k]["dtype"]] // 8 for k in order]
    assert sizes == sorted(sizes, reverse=True)
    given = list(tensors)
    for a, b in zip(order, order[1:]):
        if BITS[hdr[a]["dtype"]] == BITS[hdr[b]["dtype"]]:
            assert given.index(a) < given.index(b)
    for k in hdr:
        assert (8 + len(raw) + hdr[k]["data_offsets"][0]) % (BITS[hdr[k]["dtype"]] // 8) == 0
    # values, with numpy (memmap of the same file) as the reader
    mm = np.memmap(p, dtype=np.uint8, mode="r")
    for k, v in tensors.items():
        s, e = hdr[k]["data_offsets"]
        chunk = bytes(mm[8 + len(raw) + s: 8 + len(raw) + e])
        if k == "bf16":
            assert hdr[k]["dtype"] == "BF16"
            want = v.contiguous().view(torch.int16).numpy().tobytes()
        else:
            a = np.asarray(v)
            assert hdr[k]["dtype"] == {np.dtype(t): n for n, t in NP.items()}[a.dtype]
            want = np.ascontiguousarray(a).tobytes()
            assert np.array_equal(np.frombuffer(chunk, a.dtype).reshape(a.shape), a)
        assert chunk == want, k
        assert hdr[k]["shape"] == list(np.asarray(v).shape if k != "bf16" else v.shape)
    del mm
    # and ctorch reads its own file back bit for bit
    back, meta2 = io.load(p)
    assert meta2 == {"step": "12", "who": "ctorch"}
    for k, v in tensors.items():
        if k != "bf16":
            assert back[k].tobytes() == np.ascontiguousarray(np.asarray(v)).tobytes()
    assert io.validate(p.read_bytes()) is None


def test_save_replaces_atomically_and_keeps_old_on_failure(tmp_path):
    p = tmp_path / "ckpt.safetensors"
    io.save(p, {"a": np.ones(4, np.float32)})
    old = p.read_bytes()
    with pytest.raises(CtorchError) as e:
        io.save(p, {"a": np.ones(4, np.float32), "__metadata__": np.ones(1, np.float32)})
    assert e.value.status == "CT_EINVAL"
    with pytest.raises(CtorchError) as e:
        io.save(tmp_path / "missing" / "x.safetensors", {"a": np.ones(1, np.float32)})
    assert e.value.status == "CT_EIO"
    assert p.read_bytes() == old
    assert not [f for f in os.listdir(tmp_path) if "ctorch-tmp" in f]
    io.save(p, {"b": np.zeros(2, np.float64)}, sync=False, anonymous_temp=False)
    assert io.load(p)[0]["b"].tolist() == [0.0, 0.0]
    assert not [f for f in os.listdir(tmp_path) if "ctorch-tmp" in f]


# ---- hostile files and other formats --------------------------------------------------

@pytest.mark.parametrize("hdr,data,status,rule", [
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 4, "CT_EFORMAT", "size-mismatch"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],'
     b'"data_offsets":[4,8]}}', 8, "CT_EFORMAT", "duplicate-key"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 8, "CT_EFORMAT", "trailing"),
    (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8, "CT_EFORMAT", "gap"),
    (b'{"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}}', 4, "CT_EOVERFLOW",
     "overflow"),
    (b'{"__metadata__":{"k":1}}', 0, "CT_EFORMAT", "metadata"),
    (b'{"a\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4, "CT_EFORMAT", "utf8"),
])
def test_hostile(tmp_path, hdr, data, status, rule):
    b = struct.pack("<Q", len(hdr)) + hdr + bytes(data)
    assert io.validate(b) == rule
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b)
    with pytest.raises(CtorchError) as e:
        io.SafetensorsFile(p)
    assert e.value.status == status and f"[{rule}]" in str(e.value)


def test_other_formats_are_named(tmp_path):
    t = {"w": torch.ones(2)}
    torch.save(t, tmp_path / "zip.pt")
    torch.save(t, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    np.save(tmp_path / "a.npy", np.ones(3))
    np.savez(tmp_path / "a.npz", w=np.ones(3))
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(24))
    (tmp_path / "x.txt").write_bytes(b"hello world, not tensors")
    for name, fmt in [("zip.pt", "pytorch-zip"), ("legacy.pt", "pickle")]:
        # PyTorch checkpoints are read natively (tests/python/test_pt.py)
        assert io.detect_format(tmp_path / name) == fmt
        with io.SafetensorsFile(tmp_path / name) as f:
            assert f.format == fmt and f.keys() == ["w"]
    for name, fmt, words in [("a.npy", "numpy", "NumPy .npy"), ("a.npz", "npz", "NumPy .npz"),
                             ("x.gguf", "gguf", "GGUF")]:
        assert io.detect_format(tmp_path / name) == fmt
        with pytest.raises(CtorchError) as e:
            io.SafetensorsFile(tmp_path / name)
        assert e.value.status == "CT_EUNSUPPORTED" and words in str(e.value) and "not support" in str(e.value)
    with pytest.raises(CtorchError) as e:
        io.SafetensorsFile(tmp_path / "x.txt")
    assert e.value.status == "CT_EFORMAT" and "unknown format" in str(e.value) and "68 65 6c 6c 6f" in str(e.value)


# ---- the CLI -----------------------------------------------------------------------------

def _cli():
    env = os.environ.get("CTORCH_CLI")
    if env:
        return env
    lib = Path(ctorch.lib._name).resolve()
    cand = lib.parent / "ctorch"
    assert cand.exists(), "set CTORCH_CLI to the ctorch program"
    return str(cand)


def test_cli_inspect(tmp_path):
    p = tmp_path / "m.safetensors"
    write_st(p, [("w", "BF16", [2, 3], bytes(12)), ("b", "F32", [3], bytes(12))], {"k": "v"})
    r = subprocess.run([_cli(), "inspect", str(p), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["valid"] and j["format"] == "safetensors" and j["metadata"] == {"k": "v"}
    assert [(t["name"], t["dtype"], t["shape"], t["bytes"], t["data_offsets"]) for t in j["tensors"]] == \
        [("w", "BF16", [2, 3], 12, [0, 12]), ("b", "F32", [3], 12, [12, 24])]
    assert j["totals"]["tensors"] == 2 and j["totals"]["bytes"] == 24 and j["totals"]["elements"] == 9
    r = subprocess.run([_cli(), "inspect", str(p)], capture_output=True, text=True)
    assert r.returncode == 0 and "BF16" in r.stdout and "[2, 3]" in r.stdout
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(p.read_bytes() + b"x")
    r = subprocess.run([_cli(), "inspect", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "[trailing]" in r.stderr
    r = subprocess.run([_cli(), "inspect", str(bad), "--json"], capture_output=True, text=True)
    assert r.returncode != 0 and json.loads(r.stdout)["valid"] is False
    r = subprocess.run([_cli(), "inspect", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage" in r.stdout

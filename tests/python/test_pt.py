"""PyTorch checkpoints through ctorch: files written here by PyTorch 2.13 (torch.save, zip and
legacy formats, every dtype it saves: the typed storages of _rebuild_tensor_v2 and the untyped
ones of _rebuild_tensor_v3 for float8, uint16/32/64, complex32 and bits) load through ct_load / ctorch.io.load with identical values, dtypes, strides
and shared storages; `ctorch convert` turns them into safetensors and back into .pt files that
torch.load(weights_only=True) reads; hostile pickles and zips are refused by name, and nothing
in them ever runs."""
import io as pyio
import json
import os
import struct
import subprocess
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

from ctorch import io
from ctorch._lib import CtorchError

CLI = os.environ.get("CTORCH_CLI", "ctorch")
# complex32 samples: PyTorch's own note that ComplexHalf is experimental is not a failure
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

# Every dtype torch 2.13 saves in a state dict, and how ctorch exposes it (complex128 and
# complex32 as F64 / F16 pairs; bits8 / bits16 as their bytes).
DTYPES = [(torch.float32, "F32"), (torch.float64, "F64"), (torch.float16, "F16"),
          (torch.bfloat16, "BF16"), (torch.int8, "I8"), (torch.uint8, "U8"),
          (torch.int16, "I16"), (torch.int32, "I32"), (torch.int64, "I64"),
          (torch.bool, "BOOL"), (torch.complex64, "C64"), (torch.complex128, "F64"),
          (torch.uint16, "U16"), (torch.uint32, "U32"), (torch.uint64, "U64"),
          (torch.float8_e4m3fn, "F8_E4M3"), (torch.float8_e5m2, "F8_E5M2"),
          (torch.float8_e4m3fnuz, "F8_E4M3FNUZ"), (torch.float8_e5m2fnuz, "F8_E5M2FNUZ"),
          (torch.float8_e8m0fnu, "F8_E8M0"), (torch.complex32, "F16"),
          (torch.bits8, "U8"), (torch.bits16, "U16")]
PAIRS = (torch.complex128, torch.complex32)
CONVERTED = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
NUMPY = (torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int32,
         torch.int64, torch.bool, torch.complex64, torch.uint16, torch.uint32, torch.uint64)  # exposed with a trailing dim of 2
BITS = {torch.bits8: torch.uint8, torch.bits16: torch.int16}


def sample(dt, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dt == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dt in BITS:
        return torch.randint(0, 256, shape, generator=g).to(BITS[dt]).view(dt)
    if dt.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.complex64).to(dt)
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dt)
    return torch.randint(-100 if dt.is_signed else 0, 100, shape, generator=g).to(dt)


def raw(t):
    """A tensor's bytes (row-major), for a bitwise comparison of any dtype."""
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)


def as_torch(a, ref):
    """A numpy array from ctorch.io.load back as a torch tensor of ref's dtype."""
    a = np.array(a, order="C")
    if ref.dtype in PAIRS:  # F64 / F16 pairs: a trailing dim of 2
        assert tuple(a.shape) == (*ref.shape, 2)
        if a.size == 0:
            return torch.empty(ref.shape, dtype=ref.dtype)
        return torch.from_numpy(a.copy()).view(ref.dtype)[..., 0]
    if ref.dtype == torch.bool or a.dtype.itemsize == ref.element_size() == 8:
        return torch.from_numpy(a.copy())
    # bf16 (as bytes), float8, unsigned and bits types: their bytes, viewed as ref's dtype
    b = torch.frombuffer(bytearray(a.tobytes()), dtype=torch.uint8) if a.size else torch.zeros(0, dtype=torch.uint8)
    return b.view(ref.dtype).reshape(ref.shape)


def same(a, ref):
    t = as_torch(a, ref)
    assert t.dtype == ref.dtype and t.shape == ref.shape, (t.dtype, t.shape, ref.dtype, ref.shape)
    assert torch.equal(raw(t), raw(ref))  # bitwise


@pytest.mark.parametrize("legacy", [False, True])
def test_every_dtype(tmp_path, legacy):
    sd = OrderedDict()
    for i, (dt, _) in enumerate(DTYPES):
        sd[f"t.{i}"] = sample(dt, (3, 5), i)
        sd[f"s.{i}"] = sample(dt, (), 100 + i)       # 0-dim
        sd[f"e.{i}"] = sample(dt, (0, 4), 200 + i)   # empty
    p = tmp_path / "all.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=not legacy)
    tensors, meta = io.load(p)
    assert meta == {} and set(tensors) == set(sd)
    with io.SafetensorsFile(p) as f:
        assert f.format == ("pickle" if legacy else "pytorch-zip")
        for i, (dt, st) in enumerate(DTYPES):
            inf = f.info(f"t.{i}")
            assert inf["dtype"] == st, dt
            assert inf["shape"] == ([3, 5, 2] if dt in PAIRS else [3, 5])
    for k, ref in sd.items():
        same(tensors[k], ref)
    # the oracle reads its own zip file back the same (weights_only); 2.13's legacy loader fails
    # on its own untyped storages (AttributeError: UntypedStorage has no dtype), so not there
    if not legacy:
        back = torch.load(p, weights_only=True)
        assert all(torch.equal(raw(back[k]), raw(v)) for k, v in sd.items())


@pytest.mark.parametrize("legacy", [False, True])
def test_untyped_storage_views(tmp_path, legacy):
    """_rebuild_tensor_v3 tensors (float8, uint16) that view one untyped storage at offsets and
    strides share it in ctorch too; a dtype ctorch does not model (float4_e2m1fn_x2) is refused
    by name, not misread."""
    base = (torch.randn(6, 8) * 4).to(torch.float8_e4m3fn)
    u = torch.arange(40).to(torch.uint16).reshape(5, 8)
    sd = {"base": base, "t": base.t(), "blk": base[1:5:2, 3:8:2], "u": u, "ucol": u[:, 5],
          "flat": base.view(-1)[9:30]}
    p = tmp_path / "f8.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=not legacy)
    tensors, _ = io.load(p)
    for k, v in sd.items():
        same(tensors[k], v)
    with io.SafetensorsFile(p) as f:
        assert len(f._storages) == 2
        assert f.info("blk")["storage"] == f.info("base")["storage"] == f.info("t")["storage"]
        inf = f.info("blk")
        assert inf["dtype"] == "F8_E4M3" and inf["strides"] == [16, 2] and inf["storage_offset"] == 11
        assert f.info("ucol")["storage_offset"] == 5 and f.info("ucol")["strides"] == [8]
    q = tmp_path / "f4.pt"
    torch.save({"w": torch.zeros(2, 3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)}, q)
    torch.load(q, weights_only=True)  # torch reads it
    with pytest.raises(CtorchError, match="float4_e2m1fn_x2") as e:
        io.load(q)
    assert "CT_EUNSUPPORTED" in str(e.value)


def test_state_dict_of_a_module(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.BatchNorm1d(3))
    p = tmp_path / "m.pt"
    torch.save(m.state_dict(), p)  # an OrderedDict with _metadata (BUILD), BatchNorm's int buffer
    tensors, meta = io.load(p)
    ref = m.state_dict()
    assert list(tensors) == list(ref) or set(tensors) == set(ref)
    for k, v in ref.items():
        same(tensors[k], v)
    assert meta == {}
    # a whole training checkpoint: parameters (nn.Parameter), nested containers, scalars
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(5, 4)).sum().backward()
    opt.step()
    ck = {"model": m.state_dict(), "opt": opt.state_dict(), "step": 7, "name": "run-1",
          "params": [torch.nn.Parameter(torch.ones(2)), (torch.zeros(1, dtype=torch.int64), 0.5)],
          "none": None, "flag": True, "dtype": torch.float16}
    torch.save(ck, p)
    tensors, meta = io.load(p)
    for k, v in m.state_dict().items():
        same(tensors["model." + k], v)
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                same(tensors[f"opt.state.{pid}.{k}"], v)
    same(tensors["params.0"], torch.ones(2))
    same(tensors["params.1.0"], torch.zeros(1, dtype=torch.int64))
    assert json.loads(meta["step"]) == 7 and json.loads(meta["name"]) == "run-1"
    assert json.loads(meta["params.1.1"]) == 0.5 and json.loads(meta["none"]) is None
    assert json.loads(meta["flag"]) is True
    assert json.loads(meta["dtype"]) == "torch.float16"
    groups = json.loads(meta["opt.param_groups"])  # a subtree without tensors: one JSON value
    assert groups[0]["lr"] == 1e-3 and groups[0]["params"] == opt.state_dict()["param_groups"][0]["params"]


@pytest.mark.parametrize("legacy", [False, True])
def test_views_strides_shared_storage(tmp_path, legacy):
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    sd = {"base": base, "t": base.t(), "col": base[:, 3], "blk": base[1:5:2, 2:9:3],
          "flat": base.view(-1)[7:19], "exp": base[0:1, :4].expand(3, 4),
          "perm": torch.arange(24, dtype=torch.int16).reshape(2, 3, 4).permute(2, 0, 1)}
    p = tmp_path / "views.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=not legacy)
    tensors, _ = io.load(p)
    for k, v in sd.items():
        same(tensors[k], v)
    # views of one storage share memory in the result, as in torch
    assert np.shares_memory(tensors["base"], tensors["t"])
    assert np.shares_memory(tensors["base"], tensors["exp"])
    with io.SafetensorsFile(p) as f:
        assert len(f._storages) == 2  # base's storage once, perm's once
        inf = f.info("blk")
        assert inf["strides"] == [20, 3] and inf["storage_offset"] == 12
        assert inf["storage"] == f.info("base")["storage"]
        assert inf["data_offsets"] == [12 * 4, (12 + 20 + 6 + 1) * 4]
        assert f.info("base")["strides"] is None
        assert f.info("exp")["strides"] == [0, 1]
        # zero-copy strided views and converted copies agree with torch
        assert np.array_equal(f.numpy("t"), sd["t"].numpy())
        assert np.array_equal(f.to("blk", "f64"), sd["blk"].double().numpy())


def test_big_endian_byteorder_record(tmp_path):
    """torch writes <archive>/byteorder ("little" here); a big-endian writer stores its storages
    big-endian (here made by byte-swapping a 2.13 archive's storages and rewriting the record).
    torch.load reads the result as the oracle does: the same values."""
    sd = {"f": sample(torch.float32, (4, 3), 1), "h": sample(torch.float16, (5,), 2),
          "i": sample(torch.int64, (2, 2), 3), "c": sample(torch.complex64, (3,), 4),
          "b": sample(torch.bool, (4,), 5), "z": sample(torch.complex128, (2,), 6)}
    src = tmp_path / "le.pt"
    torch.save(sd, src)
    width = {}
    zin = zipfile.ZipFile(src)
    prefix = zin.namelist()[0].split("/", 1)[0]
    assert zin.read(f"{prefix}/byteorder") == b"little"
    pkl = zin.read(f"{prefix}/data.pkl")
    for k, v in sd.items():  # storage keys are assigned in save order: "0", "1", ...
        w = v.element_size() // (2 if v.is_complex() else 1)
        width[str(list(sd).index(k))] = w
    dst = tmp_path / "be.pt"
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for info in zin.infolist():
            data = zin.read(info)
            key = info.filename.rsplit("/", 1)[-1]
            if key == "byteorder":
                data = b"big"
            elif "/data/" in info.filename and width[key] > 1:
                data = np.frombuffer(data, f"<u{width[key]}").astype(f">u{width[key]}").tobytes()
            z.writestr(info, data)
    assert zipfile.ZipFile(dst).read(f"{prefix}/data.pkl") == pkl
    back = torch.load(dst, weights_only=True)
    tensors, _ = io.load(dst)
    for k, v in sd.items():
        assert torch.equal(back[k], v)  # the oracle reads the big-endian archive too
        same(tensors[k], v)
    with zipfile.ZipFile(dst, "a") as z, pytest.warns(UserWarning):
        z.writestr(f"{prefix}/byteorder", "middle")  # a second record of the same name
    with pytest.raises(CtorchError) as e:
        io.load(dst)
    assert "zip-duplicate" in str(e.value)


def test_zip64_archive_from_another_writer(tmp_path):
    """Python's zipfile with zip64 records forced (local and central extra fields), storages
    not aligned: read as torch would."""
    sd = {"w": sample(torch.float32, (3, 7), 1), "h": sample(torch.float16, (5,), 2),
          "t": sample(torch.int64, (4, 2), 3).t()}
    src = tmp_path / "in.pt"
    torch.save(sd, src)
    zin = zipfile.ZipFile(src)
    dst = tmp_path / "z64.pt"
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for info in zin.infolist():
            with z.open(zipfile.ZipInfo(info.filename), "w", force_zip64=True) as w:
                w.write(zin.read(info))
    assert b"\x01\x00\x10\x00" in dst.read_bytes()  # a zip64 extra block is there
    tensors, _ = io.load(dst)
    for k, v in sd.items():
        same(tensors[k], v)


def run(*args, check=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_convert_pt_to_safetensors_and_back(tmp_path):
    sd = OrderedDict()
    for i, (dt, _) in enumerate(DTYPES):
        if dt not in PAIRS and dt not in BITS:  # safetensors has no complex128 / complex32 / bits
            sd[f"w{i}"] = sample(dt, (4, 6), i)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    sd["view.t"] = base.t()
    sd["view.base"] = base
    ck = {"model": sd, "step": 3}
    src = tmp_path / "in.pt"
    torch.save(ck, src)
    st = tmp_path / "out.safetensors"
    r = run("convert", src, st)
    assert f"{len(sd)} tensors" in r.stdout
    with io.SafetensorsFile(st) as f:
        assert f.metadata == {"step": "3"}
        for k, v in sd.items():
            same(f.numpy("model." + k) if v.dtype in NUMPY else f.raw("model." + k), v)
    back = tmp_path / "back.pt"
    run("convert", st, back)
    assert zipfile.ZipFile(back).testzip() is None  # every member's CRC, by an independent reader
    got = torch.load(back, weights_only=True)
    assert isinstance(got, OrderedDict) and set(got) == {"model." + k for k in sd}
    for k, v in sd.items():
        assert got["model." + k].dtype == v.dtype and torch.equal(got["model." + k], v)
    # --dtype: floating tensors converted (as torch rounds), integers and bools kept
    half = tmp_path / "half.pt"
    run("convert", src, half, "--dtype", "bf16")
    got = torch.load(half, weights_only=True)
    for k, v in sd.items():
        # ctorch computes (so converts) f32, f64, f16, bf16 and float8 e4m3fn / e5m2; the other
        # float8 kinds (fnuz, e8m0) are storage-only in ctorch and are kept as they are
        want = v.to(torch.bfloat16) if v.dtype in CONVERTED else v
        assert got["model." + k].dtype == want.dtype and torch.equal(raw(got["model." + k]), raw(want)), k
    # pt -> pt (legacy in, zip out) and a strided input saved contiguous
    leg = tmp_path / "leg.pt"
    torch.save({"a": base.t(), "b": base}, leg, _use_new_zipfile_serialization=False)
    out = tmp_path / "leg2.pt"
    run("convert", leg, out, "--to", "pt")
    got = torch.load(out, weights_only=True)
    assert torch.equal(got["a"], base.t()) and got["a"].is_contiguous()


def test_convert_is_atomic_and_checks_its_arguments(tmp_path):
    src = tmp_path / "in.pt"
    torch.save({"w": torch.ones(3)}, src)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"old")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(src.read_bytes()[:-30])  # truncated: the end of central directory is gone
    r = run("convert", bad, out, check=False)
    assert r.returncode == 1 and "zip-eocd" in r.stderr
    assert out.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["bad.pt", "in.pt", "out.safetensors"]
    r = run("convert", src, tmp_path / "x.unknown", check=False)
    assert r.returncode == 2 and "--to" in r.stderr
    r = run("convert", src, out, "--dtype", "f12", check=False)
    assert r.returncode == 2 and "f12" in r.stderr
    # float8 .pt files are written as torch 2.x writes them (_rebuild_tensor_v3, an untyped storage)
    run("convert", src, tmp_path / "f8.pt", "--dtype", "f8e4m3")
    got = torch.load(tmp_path / "f8.pt", weights_only=True)["w"]
    assert got.dtype == torch.float8_e4m3fn and torch.equal(raw(got), raw(torch.ones(3).to(torch.float8_e4m3fn)))
    assert run("convert", "--help").stdout.startswith("usage: ctorch convert")


def test_inspect_pt(tmp_path):
    base = torch.arange(6.0).reshape(2, 3)
    p = tmp_path / "i.pt"
    torch.save({"a": base, "b": base.t(), "n": 1}, p)
    r = run("inspect", p)
    assert "PyTorch zip" in r.stdout and "strides [1, 3]" in r.stdout and "n = 1" in r.stdout
    j = json.loads(run("inspect", p, "--json").stdout)
    assert j["valid"] and j["storages"] == 1
    b = [t for t in j["tensors"] if t["name"] == "b"][0]
    assert b["strides"] == [1, 3] and b["shape"] == [3, 2] and b["storage"] == "0"


# ---- hostile files: nothing runs, each is refused by name --------------------------------

def pt_zip(pkl, records=None, name="archive"):
    buf = pyio.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/data.pkl", pkl)
        for k, v in (records or {}).items():
            z.writestr(f"{name}/data/{k}", v)
    return buf.getvalue()


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = "/nonexistent"


def test_hostile_pickles_never_run(tmp_path):
    global MARKER
    MARKER = str(tmp_path / "pwned")
    import pickle
    evil = pickle.dumps({"w": Evil()}, protocol=2)
    cases = {
        "global": (evil, "pickle-global", "posix.system"),
        "stack_global": (pickle.dumps({"w": Evil()}, protocol=4), "pickle-global", "system"),
        "reduce-allowed": (b"\x80\x02ctorch\nFloatStorage\n)R.", "pickle-unsupported", "torch.FloatStorage"),
        "reduce": (b"\x80\x02X\x01\x00\x00\x00a)R.", "pickle-reduce", "a str"),
        "build": (b"\x80\x02]}b.", "pickle-build", "a list"),
        "inst": (b"(ios\nsystem\n.", "pickle-opcode", "os.system"),
        "ext": (b"\x80\x02\x82\x01.", "pickle-opcode", "EXT1"),
        "newobj": (b"\x80\x02ccollections\nOrderedDict\n)\x81.", "pickle-newobj", "OrderedDict"),
        "memo": (b"\x80\x02h\x05.", "pickle-memo", "5"),
        "truncated": (b"\x80\x02X\xff\xff\x00\x00ab", "pickle-truncated", "BINUNICODE"),
        "frame": (b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.", "pickle-frame", "FRAME"),
        "marks": (b"\x80\x02" + b"(" * 5000 + b"N.", "pickle-depth", "MARK"),
        "nesting": (b"\x80\x02" + b"]" * 100 + b"a" * 99 + b".", "nesting", "64"),
        "huge-long": (b"\x80\x02\x8b\xff\xff\xff\x7f.", "pickle-truncated", "LONG4"),
        "persid": (b"\x80\x02X\x06\x00\x00\x00moduleq\x00\x85Q.", "pickle-persid", "module"),
    }
    for what, (pkl, rule, name) in cases.items():
        p = tmp_path / f"{what}.pt"
        p.write_bytes(pt_zip(pkl))
        with pytest.raises(CtorchError) as e:
            io.load(p)
        msg = str(e.value)
        assert f"[{rule}]" in msg and name in msg, (what, msg)
        r = run("inspect", p, check=False)
        assert r.returncode == 1 and f"[{rule}]" in r.stderr
    # the same refusals from torch itself, for the global and reduce cases
    for what in ("global", "build"):
        with pytest.raises(Exception):
            torch.load(tmp_path / f"{what}.pt", weights_only=True)
    assert not os.path.exists(MARKER)
    # legacy format: the same unpickler
    leg = tmp_path / "leg-evil.pt"
    head = pyio.BytesIO()
    torch.save({}, head, _use_new_zipfile_serialization=False)
    data = head.getvalue()
    i = data.index(b"\x80\x02}q\x00.") if b"\x80\x02}q\x00." in data else None
    assert i is not None
    leg.write_bytes(data[:i] + evil + data[i + 6:])
    with pytest.raises(CtorchError) as e:
        io.load(leg)
    assert "[pickle-global]" in str(e.value)
    assert not os.path.exists(MARKER)


def test_hostile_tensors_and_zips(tmp_path):
    good = pyio.BytesIO()
    torch.save({"w": torch.arange(4.0)}, good)
    good = good.getvalue()
    z = zipfile.ZipFile(pyio.BytesIO(good))
    name = z.namelist()[0].split("/")[0]
    pkl = z.read(f"{name}/data.pkl")
    rec = z.read(f"{name}/data/0")

    def load_bytes(b):
        p = tmp_path / "h.pt"
        p.write_bytes(b)
        with pytest.raises(CtorchError) as e:
            io.load(p)
        return str(e.value)

    # a storage record shorter than its element count; a view past the storage's end
    assert "[storage]" in load_bytes(pt_zip(pkl, {"0": rec[:8]}, name))
    assert "[tensor]" in load_bytes(pt_zip(pkl.replace(b"K\x04\x85", b"K\x09\x85"), {"0": rec}, name))
    assert "[layout]" in load_bytes(pt_zip(pkl, {}, name))  # the storage record is missing
    # a compressed member, named
    buf = pyio.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zz:
        zz.writestr(f"{name}/data.pkl", pkl)
        zz.writestr(f"{name}/data/0", rec)
    msg = load_bytes(buf.getvalue())
    assert "[zip-compressed]" in msg and "data.pkl" in msg
    # overlapping members: the central directory points two names at one local header
    b = bytearray(good)
    cd = b.rindex(b"PK\x01\x02")  # the last central entry (version)
    first_lho = struct.unpack_from("<I", b, b.index(b"PK\x01\x02") + 42)[0]
    struct.pack_into("<I", b, cd + 42, first_lho)
    assert "[zip-" in load_bytes(bytes(b))
    # a member past the end of the file
    b = bytearray(good)
    struct.pack_into("<I", b, cd + 42, len(good) + 100)
    assert "[zip-out-of-file]" in load_bytes(bytes(b))
    # bit flips in the pickle: the CRC says so
    b = bytearray(good)
    at = good.index(b"_rebuild_tensor_v2")
    b[at] ^= 1
    assert "[zip-crc]" in load_bytes(bytes(b))

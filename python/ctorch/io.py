"""Tensor files through libctorch: format detection, zero-copy loading of safetensors and
PyTorch checkpoints (.pt zip and legacy files, read safely: nothing in them is ever run),
atomic saving of safetensors and .pt files.

    from ctorch import io
    with io.SafetensorsFile("model.safetensors") as f:
        w = f.numpy("lm_head.weight")          # read-only view into the mapped file
        w32 = f.to("embed.weight", "f32")       # converted copy (bf16/f16/f8 -> f32, ...)
        print(f.metadata, f.info("embed.weight"))
    io.save("out.safetensors", {"w": np_array, "b": torch_bf16_tensor}, metadata={"step": "1"})

Views returned by ``raw``/``numpy`` keep the file open for as long as they live.

    tensors, metadata = io.load("model.pt")     # also .safetensors
    # nested containers flatten to dotted names ("model.layers.0.weight", "opt.0"), non-tensor
    # values go to metadata as JSON text; tensors viewing one storage share memory here too.
    io.save_pt("out.pt", {"w": np_array})       # torch.load(weights_only=True) reads it
"""
import ctypes

import numpy as np

from ._lib import check, cpath, cstr, lib, read_regular

MAX_DIMS = 8
ST_DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
             "U64", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4",
             "F6_E2M3", "F6_E3M2"]
FORMATS = ["unknown", "safetensors", "pytorch-zip", "pickle", "gguf", "numpy", "npz"]
CT_DTYPES = ["f32", "f64", "f16", "bf16", "i8", "u8", "i16", "i32", "i64", "bool", "f8e4m3", "f8e5m2"]
# safetensors dtype -> numpy dtype, for those numpy has.
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
         "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32, "F64": np.float64,
         "I64": np.int64, "U64": np.uint64, "C64": np.complex64}
# numpy dtype -> ct_dtype (the rest of NUMPY's dtypes are saved as raw bytes)
_NP_CT = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2,
          np.dtype(np.int8): 4, np.dtype(np.uint8): 5, np.dtype(np.int16): 6,
          np.dtype(np.int32): 7, np.dtype(np.int64): 8, np.dtype(np.bool_): 9}
_NP_RAW = {np.dtype(np.uint16): "U16", np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64",
           np.dtype(np.complex64): "C64"}

_P = ctypes.POINTER
_i64p = _P(ctypes.c_int64)


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("strides", ctypes.c_int64 * MAX_DIMS),
                ("owns", ctypes.c_bool), ("buffer", ctypes.c_void_p)]


class _Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("st_dtype", ctypes.c_int), ("has_dtype", ctypes.c_bool),
                ("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", _i64p),
                ("numel", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("data_begin", ctypes.c_uint64), ("data_end", ctypes.c_uint64),
                ("file_offset", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("strides", _i64p), ("storage", ctypes.c_size_t), ("storage_offset", ctypes.c_uint64)]


class _StorageInfo(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("st_dtype", ctypes.c_int), ("nbytes", ctypes.c_uint64),
                ("file_offset", ctypes.c_uint64), ("data", ctypes.c_void_p)]


class _Summary(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("file_bytes", ctypes.c_uint64),
                ("header_bytes", ctypes.c_uint64), ("data_offset", ctypes.c_uint64),
                ("data_bytes", ctypes.c_uint64), ("total_elements", ctypes.c_uint64),
                ("tensors", ctypes.c_size_t), ("metadata", ctypes.c_size_t),
                ("storages", ctypes.c_size_t)]


class _LoadOptions(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("populate", ctypes.c_bool)]


class _SaveOptions(ctypes.Structure):
    _fields_ = [("sync", ctypes.c_bool), ("anonymous_temp", ctypes.c_bool)]


class _SaveEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", _P(_Tensor)), ("st_dtype", ctypes.c_int),
                ("ndim", ctypes.c_int), ("shape", _i64p), ("data", ctypes.c_void_p)]


_vp = ctypes.c_void_p
lib.ct_detect_format.restype = ctypes.c_int
lib.ct_detect_format.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
lib.ct_load_options_default.restype = _LoadOptions
lib.ct_load.argtypes = [ctypes.c_char_p, _P(_LoadOptions), _P(_vp)]
lib.ct_load_memory.argtypes = [ctypes.c_char_p, ctypes.c_size_t, _P(_LoadOptions), _P(_vp)]
lib.ct_safetensors_validate.argtypes = [ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_int)]
lib.ct_st_rule_name.restype = ctypes.c_char_p
lib.ct_st_rule_name.argtypes = [ctypes.c_int]
lib.ct_tensor_file_close.argtypes = [_vp]
lib.ct_tensor_file_close.restype = None
lib.ct_tensor_file_summarize.argtypes = [_vp, _P(_Summary)]
lib.ct_tensor_file_count.argtypes = [_vp]
lib.ct_tensor_file_count.restype = ctypes.c_size_t
lib.ct_tensor_file_info.argtypes = [_vp, ctypes.c_size_t, _P(_Info)]
lib.ct_tensor_file_storage.argtypes = [_vp, ctypes.c_size_t, _P(_StorageInfo)]
lib.ct_save_pt_entries.argtypes = [ctypes.c_char_p, _P(_SaveEntry), ctypes.c_size_t, _P(_SaveOptions)]
lib.ct_tensor_file_find.argtypes = [_vp, ctypes.c_char_p, _P(ctypes.c_size_t)]
lib.ct_tensor_file_read.argtypes = [_vp, ctypes.c_size_t, ctypes.c_int, _P(_Tensor)]
lib.ct_tensor_file_metadata_count.argtypes = [_vp]
lib.ct_tensor_file_metadata_count.restype = ctypes.c_size_t
lib.ct_tensor_file_metadata.argtypes = [_vp, ctypes.c_size_t, _P(ctypes.c_char_p), _P(ctypes.c_char_p)]
lib.ct_tensor_free.argtypes = [_P(_Tensor)]
lib.ct_tensor_free.restype = None
lib.ct_save_options_default.restype = _SaveOptions
lib.ct_save_safetensors_entries.argtypes = [ctypes.c_char_p, _P(_SaveEntry), ctypes.c_size_t,
                                            _P(ctypes.c_char_p), _P(ctypes.c_char_p), ctypes.c_size_t,
                                            _P(_SaveOptions)]


def _path(p):
    return cpath(p)


def detect_format(data):
    """Format name of a file (path) or of bytes: one of FORMATS."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        head = bytes(data[:64])
    else:
        head = read_regular(data, "file", 64, count=64)
    return FORMATS[lib.ct_detect_format(head, len(head))]


def validate(data):
    """Check a safetensors file image (bytes). Returns None when valid, else the name of the
    rule it breaks ("gap", "overlap", ...)."""
    b = bytes(data)
    rule = ctypes.c_int(0)
    lib.ct_safetensors_validate(b, len(b), ctypes.byref(rule))
    return None if rule.value == 0 else lib.ct_st_rule_name(rule.value).decode()


class SafetensorsFile:
    """A file opened with ct_load (safetensors or a PyTorch checkpoint): mapped read-only,
    validated, tensors as zero-copy views. ``TensorFile`` is the same class."""

    def __init__(self, path, populate=False, force_safetensors=False):
        o = lib.ct_load_options_default()
        o.populate = bool(populate)
        if force_safetensors:
            o.format = 1
        h = ctypes.c_void_p()
        check(lib.ct_load(_path(path), ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self.path = path
        s = _Summary()
        check(lib.ct_tensor_file_summarize(h, ctypes.byref(s)))
        self.format = FORMATS[s.format]
        self.file_bytes, self.header_bytes = s.file_bytes, s.header_bytes
        self.data_offset, self.data_bytes = s.data_offset, s.data_bytes
        self._infos = []
        for i in range(s.tensors):
            inf = _Info()
            check(lib.ct_tensor_file_info(h, i, ctypes.byref(inf)))
            self._infos.append(inf)
        self._index = {inf.name.decode(): i for i, inf in enumerate(self._infos)}
        self._storages = []
        for i in range(s.storages):
            si = _StorageInfo()
            check(lib.ct_tensor_file_storage(h, i, ctypes.byref(si)))
            self._storages.append(si)
        self.metadata = {}
        for i in range(s.metadata):
            k, v = ctypes.c_char_p(), ctypes.c_char_p()
            check(lib.ct_tensor_file_metadata(h, i, ctypes.byref(k), ctypes.byref(v)))
            self.metadata[k.value.decode()] = v.value.decode()

    def close(self):
        """Unmap the file. Views still alive keep it mapped until they die."""
        self._closing = True
        self._release()

    def _release(self):
        if getattr(self, "_h", None) and getattr(self, "_views", 0) == 0:
            lib.ct_tensor_file_close(self._h)
            self._h = None

    def __del__(self):
        self._closing = True
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def keys(self):
        """Tensor names in file order (ascending data offset)."""
        return list(self._index)

    def __iter__(self):
        return iter(self._index)

    def __len__(self):
        return len(self._infos)

    def __contains__(self, name):
        return name in self._index

    def _inf(self, name):
        if not self._h:
            raise ValueError("ctorch.io: the file is closed")
        if name not in self._index:
            # Ask the library for its message (it names the tensor).
            idx = ctypes.c_size_t()
            check(lib.ct_tensor_file_find(self._h, cstr(name, "ctorch.io: tensor name"),
                                          ctypes.byref(idx)))
        return self._index[name], self._infos[self._index[name]]

    def info(self, name):
        _, t = self._inf(name)
        d = {"name": name, "dtype": ST_DTYPES[t.st_dtype], "shape": [t.shape[d] for d in range(t.ndim)],
             "numel": t.numel, "nbytes": t.nbytes, "data_offsets": [t.data_begin, t.data_end],
             "file_offset": t.file_offset}
        if self.format in ("pytorch-zip", "pickle"):
            d["strides"] = [t.strides[k] for k in range(t.ndim)] if t.strides else None
            d["storage"] = t.storage
            d["storage_offset"] = t.storage_offset
        return d

    def storage_bytes(self, index):
        """Storage `index` (.pt files; for safetensors each tensor is its own) as a read-only
        uint8 array, without copying."""
        si = self._storages[index]
        buf = (ctypes.c_uint8 * si.nbytes).from_address(si.data or 1)
        buf._owner = _ViewGuard(self)
        a = np.frombuffer(buf, dtype=np.uint8)
        a.flags.writeable = False
        return a

    def _strided(self, name, base=None):
        """(numpy dtype, view) of a tensor over its storage's bytes (or over `base`, a copy of
        them), with its strides."""
        _, t = self._inf(name)
        dt = np.dtype(NUMPY[ST_DTYPES[t.st_dtype]]).newbyteorder("<")
        buf = self.storage_bytes(t.storage) if base is None else base
        shape = [t.shape[d] for d in range(t.ndim)]
        if t.numel == 0:
            return np.zeros(shape, dt)
        strides = [t.strides[d] * dt.itemsize for d in range(t.ndim)] if t.strides else None
        flat = buf[t.data_begin:].view(np.uint8)
        if strides is None:
            return flat[:t.nbytes].view(dt).reshape(shape)
        return np.lib.stride_tricks.as_strided(flat[:t.data_end - t.data_begin].view(dt), shape,
                                               strides, writeable=False)

    def raw(self, name):
        """The tensor's bytes as a read-only uint8 array, without copying (a contiguous copy
        for strided views of .pt storages)."""
        _, t = self._inf(name)
        if t.strides:
            out = _Tensor()
            i, _ = self._inf(name)
            if t.has_dtype:
                check(lib.ct_tensor_file_read(self._h, i, t.dtype, ctypes.byref(out)))
                try:
                    return np.frombuffer(ctypes.string_at(out.data, t.nbytes), np.uint8).copy()
                finally:
                    lib.ct_tensor_free(ctypes.byref(out))
            return np.ascontiguousarray(self._strided(name)).view(np.uint8).ravel()
        buf = (ctypes.c_uint8 * t.nbytes).from_address(t.data or 1)
        buf._owner = _ViewGuard(self)  # the mapping lives while the array does
        a = np.frombuffer(buf, dtype=np.uint8)
        a.flags.writeable = False
        return a

    def numpy(self, name):
        """Zero-copy read-only array with the tensor's numpy dtype and shape. For dtypes numpy
        lacks (BF16, F8_*, F4, F6_*) use raw() or to()."""
        inf = self.info(name)
        if inf["dtype"] not in NUMPY:
            raise TypeError(f"ctorch.io: tensor {name!r} is {inf['dtype']}, which numpy has no dtype "
                            "for: use raw() for its bytes or to() to convert it")
        if inf.get("strides"):
            return self._strided(name)
        return self.raw(name).view(np.dtype(NUMPY[inf["dtype"]]).newbyteorder("<")).reshape(inf["shape"])

    def to(self, name, dtype):
        """Converted copy through ct_tensor_file_read; dtype is a ctorch dtype name ("f32",
        "bf16", ...). bf16 and f8 results come back as uint16 / uint8 bit patterns."""
        i, _ = self._inf(name)
        out = _Tensor()
        check(lib.ct_tensor_file_read(self._h, i, CT_DTYPES.index(dtype), ctypes.byref(out)))
        try:
            shape = [out.shape[d] for d in range(out.ndim)]
            npdt = {"bf16": np.uint16, "f8e4m3": np.uint8, "f8e5m2": np.uint8}.get(dtype)
            npdt = np.dtype(npdt or {"f32": np.float32, "f64": np.float64, "f16": np.float16,
                                     "i8": np.int8, "u8": np.uint8, "i16": np.int16, "i32": np.int32,
                                     "i64": np.int64, "bool": np.bool_}[dtype])
            n = int(np.prod(shape, dtype=np.int64)) * npdt.itemsize
            data = ctypes.string_at(out.data, n) if n else b""
            return np.frombuffer(data, dtype=npdt).reshape(shape).copy()
        finally:
            lib.ct_tensor_free(ctypes.byref(out))


class _ViewGuard:
    """Counts live views of a file so close() cannot unmap memory they still point to."""

    def __init__(self, f):
        self.f = f
        f._views = getattr(f, "_views", 0) + 1

    def __del__(self):
        self.f._views -= 1
        if getattr(self.f, "_closing", False):
            self.f._release()


TensorFile = SafetensorsFile


def load(path):
    """Every tensor of a safetensors file or PyTorch checkpoint as numpy arrays (copies; dtypes
    numpy lacks, such as BF16, come as the uint8 bytes of the tensor in row-major order), plus
    the metadata: returns (tensors, metadata). For .pt files nested containers flatten to dotted
    names, metadata holds the non-tensor values as JSON text, and tensors that view one storage
    are views of one copy of it (with their strides), as in torch."""
    with SafetensorsFile(path) as f:
        out = {}
        copies = {}
        pt = f.format in ("pytorch-zip", "pickle")
        for k in f.keys():
            dt = f.info(k)["dtype"]
            if pt and dt in NUMPY:
                st = f._infos[f._index[k]].storage
                if st not in copies:
                    copies[st] = f.storage_bytes(st).copy()
                a = f._strided(k, copies[st])
                if not a.flags.writeable and a.size:
                    a = np.lib.stride_tricks.as_strided(a, a.shape, a.strides, writeable=True)
                out[k] = a
            else:
                out[k] = (f.numpy(k) if dt in NUMPY else f.raw(k)).copy()
        return out, dict(f.metadata)


# torch dtypes numpy lacks -> the safetensors dtype their bytes are saved as (the names
# safetensors.torch uses; float4_e2m1fn_x2 holds two F4 values a byte, so its last dim doubles)
_TORCH_RAW = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
              "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4"}


def _as_array(v):
    """(ct_dtype or None, array, (safetensors dtype, shape) or None) for a numpy array or a
    torch tensor: bf16 goes as its bits with the ct_dtype, torch's float8 / float4 kinds as
    their bytes with the safetensors dtype and shape."""
    if hasattr(v, "data_ptr"):  # torch
        import torch
        v = v.detach().cpu()
        if v.dtype == torch.bfloat16:
            return 3, v.contiguous().view(torch.int16).numpy().view(np.uint16), None
        name = str(v.dtype).replace("torch.", "")
        if name in _TORCH_RAW:
            st = _TORCH_RAW[name]
            shape = tuple(v.shape)
            if st == "F4":
                shape = shape[:-1] + (shape[-1] * 2,) if shape else (2,)
            b = v.contiguous().view(torch.uint8).numpy()
            return None, b, (st, shape)
        v = v.numpy()
    a = np.asarray(v)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return None, a, None


def _entries(tensors, keep, fn="ctorch.io.save"):
    """The ct_save_entry array of tensors (views of numpy arrays where the strides allow, raw
    bytes for dtypes ctorch has no ct_dtype for); what must outlive the call goes to keep."""
    entries = (_SaveEntry * max(1, len(tensors)))()
    for i, (name, v) in enumerate(tensors.items()):
        forced, a, raw = _as_array(v)
        e = entries[i]
        e.name = cstr(name, f"{fn}: tensor name")
        keep.append(e.name)
        ct = forced if forced is not None else (None if raw else _NP_CT.get(a.dtype))
        if ct is not None and a.ndim <= MAX_DIMS:
            isz = a.itemsize
            if any(s < 0 or s % isz for s in a.strides):
                a = np.ascontiguousarray(a)
            t = _Tensor()
            t.data = a.ctypes.data if a.size else None
            t.dtype, t.ndim = ct, a.ndim
            for d in range(a.ndim):
                t.shape[d] = a.shape[d]
                t.strides[d] = a.strides[d] // isz
            keep += [a, t]
            e.tensor = ctypes.pointer(t)
        else:
            st = raw[0] if raw else (_NP_RAW.get(a.dtype) or {np.dtype(k): n for n, k in NUMPY.items()}.get(a.dtype))
            if st is None:
                raise TypeError(f"{fn}: tensor {name!r} has dtype {a.dtype}, which "
                                "safetensors cannot hold")
            a = np.ascontiguousarray(a)
            dims = raw[1] if raw else a.shape
            shape = (ctypes.c_int64 * max(1, len(dims)))(*dims)
            keep += [a, shape]
            e.st_dtype, e.ndim = ST_DTYPES.index(st), len(dims)
            e.shape = ctypes.cast(shape, _i64p)
            e.data = a.ctypes.data if a.size else None
    return entries


def save_pt(path, tensors, sync=True):
    """Write tensors (a dict name -> numpy array or torch tensor) to a torch.save zip checkpoint
    with ct_save_pt_entries (atomic): an OrderedDict that torch.load(weights_only=True) reads."""
    keep = []
    entries = _entries(tensors, keep, "ctorch.io.save_pt")
    o = lib.ct_save_options_default()
    o.sync = bool(sync)
    check(lib.ct_save_pt_entries(_path(path), entries, len(tensors), ctypes.byref(o)))
    del keep


def save(path, tensors, metadata=None, sync=True, anonymous_temp=True):
    """Write tensors (a dict name -> numpy array or torch tensor) and metadata (dict of str) to
    a safetensors file with ct_save_safetensors_entries (atomic; layout by descending element
    size, ties in dict order). Strided numpy arrays are passed without copying."""
    keep = []
    entries = _entries(tensors, keep)
    metadata = metadata or {}
    mk = (ctypes.c_char_p * max(1, len(metadata)))(
        *[cstr(k, "ctorch.io.save: metadata key") for k in metadata])
    mv = (ctypes.c_char_p * max(1, len(metadata)))(
        *[cstr(str(v), f"ctorch.io.save: metadata[{k!r}]") for k, v in metadata.items()])
    o = lib.ct_save_options_default()
    o.sync, o.anonymous_temp = bool(sync), bool(anonymous_temp)
    check(lib.ct_save_safetensors_entries(_path(path), entries, len(tensors), mk, mv, len(metadata),
                                          ctypes.byref(o)))
    del keep


# The ctypes mirrors above match the C structs of the loaded library (or this import fails).
from ._lib import check_layouts as _check_layouts  # noqa: E402

_check_layouts({_Tensor: "ct_tensor", _Info: "ct_tensor_info", _StorageInfo: "ct_storage_info", _Summary: "ct_tensor_file_summary", _LoadOptions: "ct_load_options", _SaveOptions: "ct_save_options", _SaveEntry: "ct_save_entry"})

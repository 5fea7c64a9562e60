"""Loading libctorch.so and the helpers every wrapper shares.

The library is looked up, in order: $CTORCH_LIB, next to this package, in the build
folders of a source checkout (build/, build-release/).
"""
import ctypes
import os
from pathlib import Path


class CtorchError(RuntimeError):
    """A ctorch call failed; ``status`` is its ct_status name, the message is ct_last_error()."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status


def _find_library():
    env = os.environ.get("CTORCH_LIB")
    if env:
        return env
    here = Path(__file__).resolve().parent
    candidates = [here / "libctorch.so"]
    root = here.parent.parent
    for b in ("build", "build-release", "build-asan"):
        candidates.append(root / b / "libctorch.so")
    for c in candidates:
        if c.exists():
            return str(c)
    raise OSError("libctorch.so not found: set CTORCH_LIB, or build the project (cmake -B build && "
                  "cmake --build build)")


lib = ctypes.CDLL(_find_library())

c_float_p = ctypes.POINTER(ctypes.c_float)
lib.ct_status_name.restype = ctypes.c_char_p
lib.ct_status_name.argtypes = [ctypes.c_int]
lib.ct_last_error.restype = ctypes.c_char_p
lib.ct_version.restype = ctypes.c_char_p
lib.ct_cuda_describe.restype = ctypes.c_char_p
lib.ct_cuda_describe.argtypes = []
lib.ct_num_threads.restype = ctypes.c_int
lib.ct_set_num_threads.argtypes = [ctypes.c_int]


class MemoryStats(ctypes.Structure):
    _fields_ = [("current_bytes", ctypes.c_size_t), ("peak_bytes", ctypes.c_size_t),
                ("alloc_count", ctypes.c_uint64), ("free_count", ctypes.c_uint64),
                ("limit_bytes", ctypes.c_size_t)]


# ---- ctypes mirrors of C structs, checked against the library's layouts ---------------------

lib.ct_abi_struct_layout.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                                     ctypes.POINTER(ctypes.c_int)]
lib.ct_abi_struct_field.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]

#: every mirror checked so far: {ctypes class: C struct name}
checked_mirrors = {}


class LayoutError(ImportError):
    """A ctypes mirror does not match the C struct this libctorch was compiled with."""


def _c_layout(cname):
    size, n = ctypes.c_size_t(), ctypes.c_int()
    if lib.ct_abi_struct_layout(cname.encode(), ctypes.byref(size), ctypes.byref(n)) != 0:
        raise LayoutError(lib.ct_last_error().decode(errors="replace"))
    fields = {}
    for i in range(n.value):
        name, off, sz = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
        if lib.ct_abi_struct_field(cname.encode(), i, ctypes.byref(name), ctypes.byref(off),
                                   ctypes.byref(sz)) != 0:
            raise LayoutError(lib.ct_last_error().decode(errors="replace"))
        fields[name.value.decode()] = (off.value, sz.value)
    return size.value, fields


def check_layouts(mirrors):
    """Check ctypes mirrors {class: "ct_struct_name"} against the library: the same sizeof,
    and every mirrored field at the C field's offset with its size. A mismatch raises
    LayoutError naming the struct and the field (run at import by each module)."""
    for cls, cname in mirrors.items():
        size, fields = _c_layout(cname)
        where = f"{cls.__module__}.{cls.__qualname__} mirrors {cname}"
        for name, _ in cls._fields_:
            if name not in fields:
                raise LayoutError(f"{where}: field '{name}' is not a field of {cname} in this libctorch")
            d = getattr(cls, name)
            off, sz = fields[name]
            if (d.offset, d.size) != (off, sz):
                raise LayoutError(f"{where}: field '{name}' is at offset {d.offset} size {d.size} in "
                                  f"Python but offset {off} size {sz} in C (python/ctorch is out of "
                                  f"date with the headers)")
        missing = sorted(set(fields) - {n for n, _ in cls._fields_})
        if missing:
            raise LayoutError(f"{where}: fields {missing} of {cname} are not mirrored")
        if ctypes.sizeof(cls) != size:
            raise LayoutError(f"{where}: sizeof is {ctypes.sizeof(cls)} in Python but {size} in C")
        checked_mirrors[cls] = cname


lib.ct_memory_stats.argtypes = [ctypes.POINTER(MemoryStats)]
lib.ct_memory_stats.restype = None
lib.ct_memory_reset_peak.restype = None


def status_name(code):
    return lib.ct_status_name(code).decode()


def check(code):
    """Raise CtorchError for a non-zero ct_status."""
    if code != 0:
        raise CtorchError(status_name(code), lib.ct_last_error().decode(errors="replace"))


def cstr(s, what):
    """s (str or bytes) as the bytes of a C string. A NUL inside would end the string there and
    the C side would see another name (``"a\\0b"`` -> ``"a"``): refused with ValueError
    naming ``what`` (PyTorch and safetensors keep such names; ctorch's C API cannot)."""
    b = s.encode() if isinstance(s, str) else bytes(s)
    at = b.find(b"\0")
    if at >= 0:
        raise ValueError(f"{what} {s!r} holds a NUL byte at offset {at}: ctorch "
                         "passes names as C strings, which end at the first NUL (rename it)")
    return b


def cpath(p):
    """A filesystem path (str, bytes or os.PathLike) as bytes for C: an embedded NUL raises
    ValueError("embedded null byte"), as Python's own open() does (C would open a shorter
    path)."""
    b = os.fsencode(p)
    if b"\0" in b:
        raise ValueError(f"embedded null byte in path {p!r}")
    return b


def read_regular(path, what, limit, count=None):
    """The bytes of the regular file `path` (at most `count` of them when given), as the C
    library reads files: opened without blocking (a FIFO would hang a plain open()), refused
    unless a regular file (a FIFO, a device such as /dev/zero, a directory), refused when
    larger than `limit` bytes. Errors are CtorchError("CT_EINVAL" / "CT_EFORMAT") naming `what`,
    the path and the rule."""
    import stat
    fd = os.open(cpath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a character device" if stat.S_ISCHR(st.st_mode)
                    else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket")
            raise CtorchError("CT_EINVAL", f"{what} {os.fsdecode(path)!r} is not a regular file "
                              f"({kind}): ctorch reads only regular files")
        if count is None and st.st_size > limit:
            raise CtorchError("CT_EFORMAT", f"{what} {os.fsdecode(path)!r} is {st.st_size} bytes, "
                              f"more than the {limit} allowed for it")
        os.set_blocking(fd, True)
        want = min(st.st_size, limit if count is None else count)
        chunks, got = [], 0
        while got < want:
            b = os.read(fd, want - got)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def memory_stats():
    s = MemoryStats()
    lib.ct_memory_stats(ctypes.byref(s))
    return {f: getattr(s, f) for f, _ in MemoryStats._fields_}


def memory_reset_peak():
    lib.ct_memory_reset_peak()


def set_num_threads(n):
    check(lib.ct_set_num_threads(n))


def num_threads():
    return lib.ct_num_threads()


# ---- passing arrays by pointer -----------------------------------------------------------

def ptr(t):
    """Address of a contiguous CPU torch tensor or numpy array (None -> NULL). No copy:
    the caller makes the tensor contiguous first (``as_c``)."""
    if t is None:
        return None
    if hasattr(t, "data_ptr"):
        if t.device.type != "cpu":
            raise ValueError("ctorch: tensors must be on the CPU")
        if not t.is_contiguous():
            raise ValueError("ctorch: tensor must be contiguous")
        return ctypes.c_void_p(t.data_ptr())
    if not t.flags["C_CONTIGUOUS"]:
        raise ValueError("ctorch: array must be C-contiguous")
    return ctypes.c_void_p(t.ctypes.data)


def as_c(t, dtype=None):
    """A contiguous CPU torch tensor (a view when it already is one)."""
    if t is None:
        return None
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()


check_layouts({MemoryStats: "ct_memory_stats_t"})

"""The ctypes mirrors of C structs (python/ctorch) are checked at import against the layouts
the library exports (ct_abi_struct_layout / ct_abi_struct_field): every mirror in the package
is checked, and a deliberately wrong mirror fails naming the struct and the field."""
import ctypes
import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

import ctorch
from ctorch import _lib
from ctorch._lib import LayoutError, check_layouts


def _modules():
    import ctorch.torch  # noqa: F401
    names = ["ctorch"] + [m.name for m in pkgutil.walk_packages(ctorch.__path__, "ctorch.")]
    return [importlib.import_module(n) for n in names]


def test_every_mirror_is_checked():
    mirrors = []
    for m in _modules():
        for v in vars(m).values():
            if isinstance(v, type) and issubclass(v, ctypes.Structure) and v.__module__ == m.__name__:
                mirrors.append(v)
    assert len(mirrors) >= 25
    unchecked = [f"{c.__module__}.{c.__qualname__}" for c in mirrors if c not in _lib.checked_mirrors]
    assert not unchecked, unchecked


def test_the_c_side():
    size, n = ctypes.c_size_t(), ctypes.c_int()
    assert ctorch.lib.ct_abi_struct_layout(b"ct_tensor", ctypes.byref(size), ctypes.byref(n)) == 0
    # data, dtype, ndim, shape, strides, owns (padded to 8), buffer
    assert size.value == 8 + 4 + 4 + 8 * 8 * 2 + 8 + 8 and n.value == 7
    assert ctorch.lib.ct_abi_struct_layout(b"ct_no_such", ctypes.byref(size), ctypes.byref(n)) != 0
    assert "ct_no_such" in ctorch.lib.ct_last_error().decode()
    name, off, sz = ctypes.c_char_p(), ctypes.c_size_t(), ctypes.c_size_t()
    assert ctorch.lib.ct_abi_struct_field(b"ct_tensor", 7, ctypes.byref(name), ctypes.byref(off),
                                          ctypes.byref(sz)) != 0
    assert ctorch.lib.ct_abi_struct_field(b"ct_tensor", 1, ctypes.byref(name), ctypes.byref(off),
                                          ctypes.byref(sz)) == 0
    assert (name.value, off.value, sz.value) == (b"dtype", 8, 4)


_GOOD = [("ignore_index", ctypes.c_int64), ("reduction", ctypes.c_int), ("label_smoothing", ctypes.c_float),
         ("class_weight", ctypes.c_void_p), ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float),
         ("scratch_bytes", ctypes.c_size_t)]


def _mirror(fields):
    return type("WrongCeOptions", (ctypes.Structure,), {"_fields_": fields})


def test_good_mirror_passes():
    check_layouts({_mirror(_GOOD): "ct_ce_options"})


@pytest.mark.parametrize("case,fields,needle", [
    ("narrow field", [("ignore_index", ctypes.c_int32)] + _GOOD[1:], "field 'ignore_index'"),
    ("swapped", [_GOOD[0], _GOOD[2], _GOOD[1]] + _GOOD[3:], "field 'label_smoothing'"),
    ("renamed", _GOOD[:-1] + [("scratch", ctypes.c_size_t)], "field 'scratch'"),
    ("missing", _GOOD[:-1], "['scratch_bytes']"),
    ("extra tail", _GOOD + [("spare", ctypes.c_int)], "field 'spare'"),
])
def test_wrong_mirror_fails(case, fields, needle):
    with pytest.raises(LayoutError) as e:
        check_layouts({_mirror(fields): "ct_ce_options"})
    assert "ct_ce_options" in str(e.value) and needle in str(e.value), str(e.value)


def test_wrong_size_with_right_fields_fails(monkeypatch):
    # A field added at the end of the C struct (not yet listed): only sizeof tells.
    real = _lib._c_layout
    monkeypatch.setattr(_lib, "_c_layout", lambda name: (real(name)[0] + 8, real(name)[1]))
    with pytest.raises(LayoutError, match=r"ct_ce_options: sizeof is 40 in Python but 48 in C"):
        check_layouts({_mirror(_GOOD): "ct_ce_options"})


def test_unknown_struct_fails():
    with pytest.raises(LayoutError, match="ct_not_a_struct"):
        check_layouts({_mirror(_GOOD): "ct_not_a_struct"})


def test_wrong_mirror_fails_at_import(tmp_path):
    (tmp_path / "bad_mirror.py").write_text(
        "import ctypes\nfrom ctorch._lib import check_layouts\n"
        "class _Opt(ctypes.Structure):\n"
        "    _fields_ = [('block_size', ctypes.c_int32), ('store_partial', ctypes.c_bool)]\n"
        "check_layouts({_Opt: 'ct_block_mask_options'})\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + sys.path)
    r = subprocess.run([sys.executable, "-c", "import bad_mirror"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode != 0
    assert "LayoutError" in r.stderr and "ct_block_mask_options" in r.stderr and "'block_size'" in r.stderr, r.stderr

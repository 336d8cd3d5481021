"""locus's DLPack boundary against a consumer and producer locus did not write: NumPy.

    python dlpack_numpy.py path/to/liblocus_dlpack_shim.so

The shim (tests/tools/dlpack_shim.cpp) exposes locus::to_dlpack and locus::from_dlpack
through ctypes. Checked here:
  * locus -> NumPy: a locus tensor's DLManagedTensor, wrapped in a "dltensor" capsule, is
    taken by numpy.from_dlpack without a copy (same pointer), with locus's values, shape,
    dtype and strides; deleting the array runs locus's deleter exactly once and frees
    the tensor (locus's cpu allocator is back where it was).
  * NumPy -> locus: arr.__dlpack__() (the legacy capsule, no max_version) goes to
    locus::from_dlpack<float, cpu, 2>; the checksums equal NumPy's own, the view is
    zero-copy, strided and offset arrays (a[1:, ::2]) are read in place, and NumPy's
    deleter runs exactly once (the capsule is renamed "used_dltensor" so that NumPy
    does not free it a second time).
  * Arrays locus refuses (float64, rank 3, reversed strides, an int8 array as bool): the
    error text says what was expected and found, and NumPy's deleter still runs once.
Exit status 0 when every check passes, 1 otherwise; 77 (skipped) without NumPy.
"""
import ctypes
import gc
import sys

try:
    import numpy as np
except ImportError:
    print("SKIPPED: no numpy in this Python")
    sys.exit(77)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


from dlpack_ctypes import DLTENSOR, USED_DLTENSOR, LocusTensor, capi, load_shim  # noqa: E402

shim = load_shim(sys.argv[1])


# ---- locus -> NumPy -------------------------------------------------------------------
base_bytes = shim.locus_shim_cpu_allocated_bytes()
deletes = shim.locus_shim_locus_deletes()
m = shim.locus_shim_make_f32(3, 4, 0)
pointer = shim.locus_shim_data_pointer(m)
check(shim.locus_shim_cpu_allocated_bytes() >= base_bytes + 3 * 4 * 4, "locus allocated the 3x4 f32 tensor")
arr = np.from_dlpack(LocusTensor(m))
expect = np.arange(12, dtype=np.float64).reshape(3, 4) + 0.5
check(arr.dtype == np.float32 and arr.shape == (3, 4), f"NumPy sees f32 [3, 4] (found {arr.dtype} {arr.shape})")
check(arr.strides == (16, 4), f"NumPy sees C-contiguous strides (16, 4) bytes (found {arr.strides})")
check(np.array_equal(arr, expect.astype(np.float32)), "NumPy reads locus's values a(i, j) = 4 i + j + 0.5")
check(arr.ctypes.data == pointer, "zero-copy: the array's data pointer is the locus tensor's")
check(shim.locus_shim_locus_deletes() == deletes, "the deleter has not run while the array lives")
view = arr[1:, ::2]  # a NumPy view keeps the base (and so the DLManagedTensor) alive
del arr
gc.collect()
check(shim.locus_shim_locus_deletes() == deletes, "a NumPy view of the array keeps locus's tensor alive")
check(float(view.sum()) == 4.5 + 6.5 + 8.5 + 10.5, "the view reads the right elements")
del view
gc.collect()
check(shim.locus_shim_locus_deletes() == deletes + 1, "deleting the array runs locus's deleter exactly once")
check(shim.locus_shim_cpu_allocated_bytes() == base_bytes, "locus's tensor was freed (cpu allocated bytes as before)")

deletes = shim.locus_shim_locus_deletes()
arr = np.from_dlpack(LocusTensor(shim.locus_shim_make_f32(2, 3, 4)))
check(arr.shape == (2, 3, 4) and arr.strides == (48, 16, 4), f"a rank-3 tensor: shape and strides ({arr.strides})")
check(np.array_equal(arr, (np.arange(24, dtype=np.float32) + 0.5).reshape(2, 3, 4)), "rank-3 values")
del arr
gc.collect()
arr = np.from_dlpack(LocusTensor(shim.locus_shim_make_i64(9)))
check(arr.dtype == np.int64 and np.array_equal(arr, np.arange(9, dtype=np.int64) ** 2 - 7), "an i64 tensor")
del arr
gc.collect()
check(shim.locus_shim_locus_deletes() == deletes + 2, "each of two more arrays ran locus's deleter once")
check(shim.locus_shim_cpu_allocated_bytes() == base_bytes, "and freed its tensor")

# ---- NumPy -> locus -------------------------------------------------------------------
ERR = ctypes.create_string_buffer(512)


def consume(arr, fn="f32_2d"):
    """Hands arr.__dlpack__() to the shim; returns (rc, out, error text, NumPy deletes)."""
    before = shim.locus_shim_consumer_deletes()
    try:
        capsule = arr.__dlpack__()  # legacy: no max_version, so an unversioned "dltensor"
    except TypeError:
        capsule = arr.__dlpack__(stream=None)
    check(capi.PyCapsule_GetName(capsule) == b"dltensor", "NumPy's capsule is named dltensor")
    managed = capi.PyCapsule_GetPointer(capsule, ctypes.cast(DLTENSOR, ctypes.c_char_p))
    # from here the shim owns the DLManagedTensor: NumPy must not delete it again
    capi.PyCapsule_SetName(capsule, ctypes.cast(USED_DLTENSOR, ctypes.c_char_p))
    ERR.value = b""
    if fn == "f32_2d":
        out = (ctypes.c_double * 5)()
        rc = shim.locus_shim_consume_f32_2d(managed, out, ERR, len(ERR))
        result = list(out)
    else:
        count = ctypes.c_longlong(-1)
        rc = shim.locus_shim_consume_bool_1d(managed, ctypes.byref(count), ERR, len(ERR))
        result = count.value
    del capsule
    gc.collect()
    return rc, result, ERR.value.decode(), shim.locus_shim_consumer_deletes() - before


def weighted(a):
    a = a.astype(np.float64)
    return float((a * (np.arange(a.size, dtype=np.float64).reshape(a.shape) + 1)).sum())


rng = np.random.default_rng(17)
a = rng.standard_normal((5, 7)).astype(np.float32)
rc, out, err, n = consume(a)
check(rc == 0, f"from_dlpack<float, cpu, 2> takes a NumPy f32 [5, 7] array {err}")
check(out[:2] == [5.0, 7.0], f"shape [5, 7] (found {out[:2]})")
check(out[2] == float(a.astype(np.float64).sum()), f"sum {out[2]!r} equals NumPy's {float(a.astype(np.float64).sum())!r}")
check(out[3] == weighted(a), "the position-weighted checksum equals NumPy's (layout read right)")
check(int(out[4]) == a.ctypes.data, "zero-copy: locus's view points at NumPy's buffer")
check(n == 1, f"NumPy's deleter ran exactly once (ran {n} times)")

big = rng.standard_normal((6, 9)).astype(np.float32)
s = big[1:, ::2]  # strided and offset: shape (5, 5), strides (9, 2) elements, offset 9
rc, out, err, n = consume(s)
check(rc == 0, f"a strided, offset view a[1:, ::2] is taken {err}")
check(out[:2] == [5.0, 5.0] and out[3] == weighted(s) and out[2] == float(s.astype(np.float64).sum()),
      "its values are read in place (sum and weighted checksum equal NumPy's)")
check(int(out[4]) == s.ctypes.data, "at NumPy's address of s[0, 0] (byte_offset and strides honoured)")
check(n == 1, f"NumPy's deleter ran exactly once (ran {n} times)")

t = np.asfortranarray(rng.standard_normal((4, 3)).astype(np.float32))
rc, out, err, n = consume(t)
check(rc == 0 and out[3] == weighted(t) and n == 1, "a column-major (Fortran-order) array is read right")

rc, out, err, n = consume(np.zeros((0, 3), dtype=np.float32))
check(rc == 0 and out[:3] == [0.0, 3.0, 0.0] and n == 1, "an empty [0, 3] array")

mask = np.array([True, False, True, True, False])
rc, count, err, n = consume(mask, fn="bool_1d")
check(rc == 0 and count == 3 and n == 1, f"a NumPy bool array (kDLBool) is taken as bool: {count} true {err}")

refusals = [
    ("float64", np.ones((2, 2)),
     "locus: from_dlpack<f32, cpu, 2>: expected dtype f32 (code 2 kDLFloat, 32 bits, 1 lane), found code 2 "
     "(kDLFloat), 64 bits, 1 lane"),
    ("rank 3", np.ones((2, 2, 2), dtype=np.float32),
     "locus: from_dlpack<f32, cpu, 2>: expected ndim 2, found ndim 3"),
    ("int32", np.ones((2, 2), dtype=np.int32),
     "locus: from_dlpack<f32, cpu, 2>: expected dtype f32 (code 2 kDLFloat, 32 bits, 1 lane), found code 0 "
     "(kDLInt), 32 bits, 1 lane"),
    ("reversed rows", np.ones((3, 2), dtype=np.float32)[::-1],
     "locus: from_dlpack<f32, cpu, 2>: expected strides >= 0, found -2 on axis 0 (shape [3, 2], strides [-2, 1]); "
     "locus views do not step backwards: copy the array first (numpy.ascontiguousarray)"),
]
for name, arr, expect in refusals:
    rc, out, err, n = consume(arr)
    check(rc == 1 and err == expect, f"{name} refused: {err!r}")
    check(n == 1, f"{name}: NumPy's deleter still ran exactly once (ran {n} times)")
rc, count, err, n = consume(np.array([0, 1, 2], dtype=np.int8), fn="bool_1d")
check(rc == 1 and err == "locus: from_dlpack<bool, cpu, 1>: expected dtype bool (code 1 kDLUInt or 6 kDLBool, "
      "8 bits, 1 lane), found code 0 (kDLInt), 8 bits, 1 lane" and n == 1, f"int8 as bool refused: {err!r}")
rc, count, err, n = consume(np.array([0, 1, 2], dtype=np.uint8), fn="bool_1d")
check(rc == 1 and err == "locus: from_dlpack<bool, cpu, 1>: a bool element holds the byte 2 (element 2, index [2]); "
      "bools are 0 or 1: take from_dlpack<u8, cpu, 1> for bytes" and n == 1, f"uint8 bytes 0, 1, 2 as bool: {err!r}")

print(f"numpy {np.__version__}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)

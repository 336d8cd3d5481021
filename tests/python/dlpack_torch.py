"""locus's DLPack boundary against PyTorch on the CPU (torch.from_dlpack and
torch.utils.dlpack.to_dlpack), through the same shim as dlpack_numpy.py.

    python dlpack_torch.py path/to/liblocus_dlpack_shim.so

  * locus -> PyTorch: torch.from_dlpack takes a locus tensor without a copy (same data
    pointer), with locus's values; deleting the tensor runs locus's deleter exactly once.
  * PyTorch -> locus: to_dlpack(t) for a contiguous and a strided, offset tensor goes to
    locus::from_dlpack<float, cpu, 2>: checksums equal PyTorch's, zero-copy, PyTorch's
    deleter runs once; a float64 tensor is refused with the reason, the deleter still once.
Exit status 0 when every check passes, 1 otherwise; 77 (skipped) without PyTorch.
(PyTorch on a GPU, kDLCUDA both ways, is owed to a session with a GPU.)
"""
import ctypes
import gc
import sys

try:
    import torch
    import torch.utils.dlpack
except ImportError:
    print("SKIPPED: no torch in this Python")
    sys.exit(77)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


from dlpack_ctypes import DLTENSOR, LocusTensor, capi, load_shim  # noqa: E402
from dlpack_ctypes import USED_DLTENSOR as USED  # noqa: E402

shim = load_shim(sys.argv[1])


# ---- locus -> PyTorch
base = shim.locus_shim_cpu_allocated_bytes()
deletes = shim.locus_shim_locus_deletes()
m = shim.locus_shim_make_f32(3, 4, 0)
pointer = shim.locus_shim_data_pointer(m)
t = torch.from_dlpack(LocusTensor(m))
expect = (torch.arange(12, dtype=torch.float64).reshape(3, 4) + 0.5).float()
check(t.dtype == torch.float32 and tuple(t.shape) == (3, 4), f"PyTorch sees f32 [3, 4] ({t.dtype} {tuple(t.shape)})")
check(torch.equal(t, expect), "PyTorch reads locus's values")
check(t.data_ptr() == pointer, "zero-copy: the tensor's data pointer is locus's")
check(shim.locus_shim_locus_deletes() == deletes, "the deleter waits while the tensor lives")
del t
gc.collect()
check(shim.locus_shim_locus_deletes() == deletes + 1, "deleting the tensor runs locus's deleter exactly once")
check(shim.locus_shim_cpu_allocated_bytes() == base, "and frees locus's tensor")

# ---- PyTorch -> locus
ERR = ctypes.create_string_buffer(512)


def consume(x):
    before = shim.locus_shim_consumer_deletes()
    capsule = torch.utils.dlpack.to_dlpack(x)
    managed = capi.PyCapsule_GetPointer(capsule, ctypes.cast(DLTENSOR, ctypes.c_char_p))
    capi.PyCapsule_SetName(capsule, ctypes.cast(USED, ctypes.c_char_p))  # the shim owns it now
    out = (ctypes.c_double * 5)()
    ERR.value = b""
    rc = shim.locus_shim_consume_f32_2d(managed, out, ERR, len(ERR))
    del capsule
    gc.collect()
    return rc, list(out), ERR.value.decode(), shim.locus_shim_consumer_deletes() - before


def weighted(x):
    x = x.double()
    return float((x * (torch.arange(x.numel(), dtype=torch.float64).reshape(x.shape) + 1)).sum())


g = torch.Generator().manual_seed(5)
a = torch.randn(5, 7, generator=g)
rc, out, err, n = consume(a)
check(rc == 0 and out[:2] == [5.0, 7.0], f"from_dlpack<float, cpu, 2> takes PyTorch's f32 [5, 7] {err}")
check(out[2] == float(a.double().sum()) and out[3] == weighted(a), "checksums equal PyTorch's")
check(int(out[4]) == a.data_ptr(), "zero-copy: locus's view points at PyTorch's storage")
check(n == 1, f"PyTorch's deleter ran exactly once ({n})")
big = torch.randn(6, 9, generator=g)
s = big[1:, ::2]
rc, out, err, n = consume(s)
check(rc == 0 and out[3] == weighted(s) and int(out[4]) == s.data_ptr() and n == 1,
      f"a strided, offset view big[1:, ::2] is read in place {err}")
rc, out, err, n = consume(torch.zeros(2, 2, dtype=torch.float64))
check(rc == 1 and "expected dtype f32" in err and "64 bits" in err and n == 1, f"float64 is refused with the reason, deleter once: {err!r} ({n})")

if failures:
    print(f"FAILED: {len(failures)} checks")
    sys.exit(1)
print("dlpack_torch: all checks passed")

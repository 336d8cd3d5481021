"""The ctypes side shared by dlpack_numpy.py and dlpack_torch.py: the shim library's
functions (tests/tools/dlpack_shim.cpp) with their signatures, the PyCapsule calls, the
capsule names, and a producer object for the legacy DLPack protocol."""
import ctypes


def load_shim(path):
    shim = ctypes.CDLL(path)
    shim.locus_shim_make_f32.restype = ctypes.c_void_p
    shim.locus_shim_make_f32.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    shim.locus_shim_make_i64.restype = ctypes.c_void_p
    shim.locus_shim_make_i64.argtypes = [ctypes.c_int]
    shim.locus_shim_data_pointer.restype = ctypes.c_size_t
    shim.locus_shim_data_pointer.argtypes = [ctypes.c_void_p]
    shim.locus_shim_consume_f32_2d.restype = ctypes.c_int
    shim.locus_shim_consume_f32_2d.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_char_p,
                                               ctypes.c_int]
    shim.locus_shim_consume_bool_1d.restype = ctypes.c_int
    shim.locus_shim_consume_bool_1d.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p,
                                                ctypes.c_int]
    shim.locus_shim_cpu_allocated_bytes.restype = ctypes.c_longlong
    return shim


capi = ctypes.pythonapi
capi.PyCapsule_New.restype = ctypes.py_object
capi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_SetName.restype = ctypes.c_int
capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
capi.PyCapsule_GetName.restype = ctypes.c_char_p
capi.PyCapsule_GetName.argtypes = [ctypes.py_object]

# A capsule keeps its name's pointer, not a copy: these buffers live as long as the module.
DLTENSOR = ctypes.create_string_buffer(b"dltensor")
USED_DLTENSOR = ctypes.create_string_buffer(b"used_dltensor")


def name(buf):
    return ctypes.cast(buf, ctypes.c_char_p)


class LocusTensor:
    """A producer object as numpy.from_dlpack and torch.from_dlpack expect one (the legacy
    protocol: the capsule holds an unversioned DLManagedTensor; the consumer renames it)."""

    def __init__(self, managed):
        self.managed = managed

    def __dlpack__(self, stream=None, **kwargs):
        return capi.PyCapsule_New(self.managed, name(DLTENSOR), None)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0

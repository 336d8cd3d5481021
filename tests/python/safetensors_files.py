#!/usr/bin/env python3
"""Writes safetensors files with the Python `safetensors` package (Hugging Face's writer,
independent of locus), and corrupt ones byte by byte, for tests/test_safetensors_python.cpp
(the CTests "interop: locus reads every safetensors dtype the Python package writes", "...
a typed request for another dtype or rank ..." and "... corrupt safetensors files written
by Python are io_errors").

    safetensors_files.py OUTDIR

OUTDIR/values.safetensors   safetensors.numpy.save_file: one tensor per dtype numpy has
                            (F32, F64, F16, I32, I64, U8, BOOL), with extremes (NaN with
                            payloads, inf, -0.0, subnormals, the largest finite values,
                            i32/i64 min and max), every one of the 65536 f16 encodings,
                            every u8, a rank-0 and an empty tensor, ranks 0 to 4
OUTDIR/bf16.safetensors     safetensors.serialize_file (the package's raw API: numpy has no
                            bfloat16) with every one of the 65536 bf16 encodings, and
                            bf16 values rounded here from f32 sources (to nearest, ties
                            to even, computed from the values, not with a bit trick)
OUTDIR/others.safetensors   dtypes locus has no C++ type for (I8, I16, U16, U32, U64, C64,
                            the F8 variants, F4): the file must still open
OUTDIR/expected.json        per tensor: dtype, shape, the elements as bit patterns (floats)
                            or integers, and float values as Python's repr (read back
                            with strtod: "nan", "inf", "-0.0", "5e-324")
OUTDIR/mlp*.safetensors     the weights of nn.Sequential(Linear(4, 3), ReLU, Linear(3, 2))
                            in f32 (loads), and in f64, f16, with an I32 bias, with a
                            weight of rank 1, or with a missing tensor (each refused by
                            nn::load into an f32 model); mlp.json holds the f32 values
OUTDIR/bad/*.safetensors    corrupt and truncated files (see `bad` below), with
OUTDIR/bad/manifest.json    per file: what is wrong, a fragment locus's message must hold,
                            and whether the package's own reader (safe_open) refuses it

Needs numpy and safetensors (scripts/install-deps puts both in ~/.cache/locus-test-venv);
without them: exit 77 (CTest: skipped)."""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import TensorSpec, safe_open, serialize_file
    from safetensors.numpy import save as np_save_bytes
    from safetensors.numpy import save_file as np_save_file
except ImportError as e:
    print(f"SKIPPED: this Python lacks numpy or safetensors ({e}); scripts/install-deps puts both in "
          "~/.cache/locus-test-venv")
    sys.exit(77)

if len(sys.argv) != 2:
    print("usage: safetensors_files.py OUTDIR", file=sys.stderr)
    sys.exit(2)
out = sys.argv[1]
os.makedirs(os.path.join(out, "bad"), exist_ok=True)
rng = np.random.default_rng(20240612)
np.seterr(all="ignore")  # the NaNs, overflows to inf and signalling NaNs below are meant
expected = {}


def f_repr(x):
    """A float as text strtod reads back to the same double."""
    x = float(x)
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return repr(x)  # shortest round trip; "inf", "-inf", "-0.0"


def record_float(name, arr, bits_dtype):
    """Expected bits (the array's own encoding) and values (as f64, by numpy's widening)."""
    expected[name] = {
        "dtype": {np.float32: "F32", np.float64: "F64", np.float16: "F16"}[arr.dtype.type],
        "shape": list(arr.shape),
        "bits": [int(b) for b in arr.reshape(-1).view(bits_dtype)],
        "values": [f_repr(v) for v in arr.reshape(-1).astype(np.float64)],
    }


def record_int(name, arr, dtype):
    expected[name] = {"dtype": dtype, "shape": list(arr.shape), "values": [int(v) for v in arr.reshape(-1)]}


# ---- values.safetensors: every dtype numpy has ------------------------------------------
f32_bits = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF,  # 0 -0 1 -1 max -max
            0x00800000, 0x80800000, 0x00000001, 0x80000001, 0x007FFFFF,  # min normal, subnormals
            0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FA00001, 0x7F800001,  # inf, NaNs (payloads)
            0x3DCCCCCD, 0x40490FDB, 0x4B800001, 0x34000000]  # 0.1, pi, 2^24 + 2, 2^-23
f32 = np.array(f32_bits, dtype=np.uint32).view(np.float32)
f32 = np.concatenate([f32, rng.standard_normal(48 - f32.size).astype(np.float32) * 1e3]).reshape(6, 8)
f64_bits = [0x0000000000000000, 0x8000000000000000, 0x3FF0000000000000, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
            0x0010000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
            0x7FF8000000000000, 0xFFF8000000000001, 0x7FF0000000000001, 0x3FB999999999999A,
            0x43E0000000000000, 0x4340000000000001]  # ... 0.1, 2^63, 2^53 + 2
f64 = np.concatenate([np.array(f64_bits, dtype=np.uint64).view(np.float64), rng.standard_normal(4) * 1e300])
f16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(16, 64, 64)  # every encoding
i32 = np.concatenate([np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max, -1, 0, 1], dtype=np.int32),
                      rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, 7, dtype=np.int32)]).reshape(3, 4)
i64 = np.concatenate([np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, np.iinfo(np.int64).min + 1, -1, 0, 1,
                                2**53 + 1, -(2**53) - 1, 2**32], dtype=np.int64),
                      rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 7, dtype=np.int64)])
u8 = np.arange(256, dtype=np.uint8).reshape(2, 2, 8, 8)  # every value, rank 4
boolean = (rng.integers(0, 2, 15) == 1).reshape(3, 5)
boolean[0, 0], boolean[0, 1] = True, False
scalar = np.array(-2.5, dtype=np.float64)  # rank 0
empty = np.zeros((0, 3), dtype=np.float32)  # no elements

values = {"f32": f32, "f64": f64, "f16": f16, "i32": i32, "i64": i64, "u8": u8, "bool": boolean,
          "scalar": scalar, "empty": empty}
record_float("f32", f32, np.uint32)
record_float("f64", f64, np.uint64)
record_float("f16", f16, np.uint16)
record_float("scalar", scalar, np.uint64)
record_float("empty", empty, np.uint32)
record_int("i32", i32, "I32")
record_int("i64", i64, "I64")
record_int("u8", u8, "U8")
record_int("bool", boolean.astype(np.int64), "BOOL")
# f16 values rounded by numpy from f32 (locus::f16(float) must give the same bits)
f16_src = np.concatenate([np.array([65504.0, 65519.99, 65520.0, -65520.0, 6.103515625e-05, 5.960464477539063e-08,
                                    2.980232238769531e-08, 2.9802326e-08, 1.0 + 2**-11, 1.0 + 3 * 2**-11, -0.0,
                                    float("inf"), 1e-45], dtype=np.float32),
                          rng.standard_normal(51).astype(np.float32) * 100]).astype(np.float32)
values["f16_rounded"] = f16_src.astype(np.float16)
values["f16_source"] = f16_src
record_float("f16_rounded", values["f16_rounded"], np.uint16)
record_float("f16_source", f16_src, np.uint32)
np_save_file(values, os.path.join(out, "values.safetensors"), metadata={"writer": "tests/python/safetensors_files.py"})


# ---- bf16.safetensors: the package's raw API --------------------------------------------
def bf16_round(x32):
    """The bf16 encoding nearest to the f32 value x32 (ties to the even encoding), found by
    comparing the values of the two candidates (exact in f64), not by adding to the bits."""
    bits = int(np.array([x32], dtype=np.float32).view(np.uint32)[0])
    v = float(x32)
    if math.isnan(v):
        return None  # any NaN encoding is right; the C++ side checks that it is a NaN
    sign, mag = bits & 0x80000000, bits & 0x7FFFFFFF
    lo = mag >> 16  # the candidate toward zero
    dec = lambda b: struct.unpack("<f", struct.pack("<I", b << 16))[0]  # noqa: E731
    a = abs(v)
    vlo = dec(lo)
    if vlo == a:
        return (sign >> 16) | lo
    vhi = dec(lo + 1) if lo + 1 < 0x7F80 else 2.0**128  # past the largest finite: infinity, at 2^128 for rounding
    dlo, dhi = a - vlo, vhi - a
    pick = lo if dlo < dhi else lo + 1 if dhi < dlo else (lo if lo % 2 == 0 else lo + 1)
    return (sign >> 16) | pick


bf16_all = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)  # every encoding
bf16_src = np.concatenate([np.array(f32_bits, dtype=np.uint32).view(np.float32),
                           np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-23, -(1.0 + 2**-8),
                                     3.3895314e38, 3.3961776e38, 3.4028235e38, 2**-133, 2**-133 + 2**-141,
                                     1.5 * 2**-141], dtype=np.float32),
                           rng.standard_normal(64).astype(np.float32) * 1e4,
                           rng.standard_normal(16).astype(np.float32) * 1e-39]).astype(np.float32)
bf16_rounded = [bf16_round(x) for x in bf16_src]
bf16_rounded_arr = np.array([0x7FC0 if b is None else b for b in bf16_rounded], dtype=np.uint16)
dec16 = lambda b: struct.unpack("<f", struct.pack("<I", int(b) << 16))[0]  # noqa: E731
expected["bf16_all"] = {"dtype": "BF16", "shape": list(bf16_all.shape),
                        "bits": [int(b) for b in bf16_all.reshape(-1)],
                        "values": [f_repr(dec16(b)) for b in bf16_all.reshape(-1)]}
expected["bf16_rounded"] = {"dtype": "BF16", "shape": [len(bf16_rounded)],
                            "bits": [int(b) for b in bf16_rounded_arr],  # as written (a NaN source: 0x7FC0)
                            "values": [f_repr(dec16(b)) for b in bf16_rounded_arr],
                            "rounding": [-1 if b is None else b for b in bf16_rounded]}  # -1: any NaN is right
expected["bf16_source"] = {"dtype": "F32", "shape": [bf16_src.size],
                           "bits": [int(b) for b in bf16_src.view(np.uint32)],
                           "values": [f_repr(v) for v in bf16_src.astype(np.float64)]}
keep = [bf16_all, bf16_rounded_arr, bf16_src]  # alive while serialize_file reads them
serialize_file({
    "bf16_all": TensorSpec(dtype="bfloat16", shape=list(bf16_all.shape), data_ptr=bf16_all.ctypes.data,
                           data_len=bf16_all.nbytes),
    "bf16_rounded": TensorSpec(dtype="bfloat16", shape=[bf16_rounded_arr.size], data_ptr=bf16_rounded_arr.ctypes.data,
                               data_len=bf16_rounded_arr.nbytes),
    "bf16_source": TensorSpec(dtype="float32", shape=[bf16_src.size], data_ptr=bf16_src.ctypes.data,
                              data_len=bf16_src.nbytes),
}, os.path.join(out, "bf16.safetensors"), metadata={"writer": "tests/python/safetensors_files.py"})
with safe_open(os.path.join(out, "bf16.safetensors"), framework="numpy") as f:  # what the package wrote
    assert f.get_slice("bf16_all").get_dtype() == "BF16", f.get_slice("bf16_all").get_dtype()

# ---- others.safetensors: dtypes locus has no C++ type for --------------------------------
raw = rng.integers(0, 256, 64, dtype=np.uint8)
others = {}
specs = {}
for name, dt, shape, size in [("i8", "int8", [4], 1), ("i16", "int16", [2, 2], 2), ("u16", "uint16", [3], 2),
                              ("u32", "uint32", [2], 4), ("u64", "uint64", [1], 8), ("c64", "complex64", [2], 8),
                              ("f8_e4m3", "float8_e4m3fn", [5], 1), ("f8_e5m2", "float8_e5m2", [5], 1),
                              ("f8_e4m3fnuz", "float8_e4m3fnuz", [3], 1), ("f8_e5m2fnuz", "float8_e5m2fnuz", [3], 1),
                              ("f8_e8m0", "float8_e8m0fnu", [2], 1), ("f4", "float4_e2m1fn_x2", [2, 2], 1)]:
    n = int(np.prod(shape)) * size  # F4: the package's shape counts pairs (its header: [2, 4] elements)
    buf = np.ascontiguousarray(raw[:n])
    keep.append(buf)
    specs[name] = TensorSpec(dtype=dt, shape=shape, data_ptr=buf.ctypes.data, data_len=n)
    others[name] = {"shape": shape, "bytes": [int(b) for b in buf]}
serialize_file(specs, os.path.join(out, "others.safetensors"))
with safe_open(os.path.join(out, "others.safetensors"), framework="numpy") as f:
    for k in f.keys():
        others[k]["dtype"] = f.get_slice(k).get_dtype()  # the package's spelling (C64, F8_E4M3, ...)
        others[k]["shape"] = f.get_slice(k).get_shape()  # as its header says (F4: elements, not pairs)
expected["__others__"] = others

with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump(expected, f)

# ---- mlp*.safetensors: weights for nn::load ----------------------------------------------
mlp = {"0.weight": rng.standard_normal((3, 4)).astype(np.float32), "0.bias": rng.standard_normal(3).astype(np.float32),
       "2.weight": rng.standard_normal((2, 3)).astype(np.float32), "2.bias": rng.standard_normal(2).astype(np.float32)}
np_save_file(mlp, os.path.join(out, "mlp.safetensors"))
np_save_file({k: v.astype(np.float64) for k, v in mlp.items()}, os.path.join(out, "mlp_f64.safetensors"))
np_save_file({k: v.astype(np.float16) for k, v in mlp.items()}, os.path.join(out, "mlp_f16.safetensors"))
np_save_file({**mlp, "2.bias": np.array([7, -9], dtype=np.int32)}, os.path.join(out, "mlp_i32_bias.safetensors"))
np_save_file({**mlp, "0.weight": mlp["0.weight"].reshape(-1)}, os.path.join(out, "mlp_rank1.safetensors"))
np_save_file({k: v for k, v in mlp.items() if k != "2.bias"}, os.path.join(out, "mlp_missing.safetensors"))
x = rng.standard_normal((5, 4)).astype(np.float32)
y = np.maximum(x.astype(np.float64) @ mlp["0.weight"].astype(np.float64).T + mlp["0.bias"], 0.0)
y = y @ mlp["2.weight"].astype(np.float64).T + mlp["2.bias"]
with open(os.path.join(out, "mlp.json"), "w") as f:
    json.dump({"weights": {k: [f_repr(v) for v in a.reshape(-1)] for k, a in mlp.items()},
               "x": [f_repr(v) for v in x.reshape(-1)], "y": [f_repr(v) for v in y.reshape(-1)]}, f)

# ---- bad/: corrupt and truncated files ----------------------------------------------------
good = np_save_bytes({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2, 3, -4], np.int64)})
with open(os.path.join(out, "bad", "good.safetensors"), "wb") as f:  # the control: must load
    f.write(good)
n_good = struct.unpack("<Q", good[:8])[0]
header_good = json.loads(good[8:8 + n_good])
data_good = good[8 + n_good:]


def le64(n):
    return struct.pack("<Q", n)


def st(header, data=b""):
    """A file from a header (a dict, or the exact text as str/bytes) and its data bytes."""
    text = header if isinstance(header, (bytes, str)) else json.dumps(header)
    text = text.encode() if isinstance(text, str) else text
    return le64(len(text)) + text + data


def f32b(*v):
    return struct.pack(f"<{len(v)}f", *v)


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


bad = []  # (name, what is wrong, a fragment locus's message must hold, bytes)


def case(name, what, fragment, data):
    bad.append((name, what, fragment, data))


case("empty_file", "an empty file", "too short for a safetensors header length", b"")
case("seven_bytes", "7 bytes: no room for the 8-byte header length", "too short", good[:7])
case("header_beyond_file", "a header length one byte past the end of the file", "truncated or corrupt",
     le64(len(good) - 8 + 1) + good[8:])
case("header_length_huge", "a header length of 2^64 - 1", "truncated or corrupt", le64(2**64 - 1) + good[8:])
case("header_length_zero", "a header length of 0", "header length is 0", le64(0) + good[8:])
case("header_over_100mb", "a header length of 100 MB + 1 in a file that has the bytes (sparse)", "more than the",
     None)  # written below as a sparse file
case("not_json", "a header of the right length that is not JSON", "not valid JSON",
     st(b"this is not json at all!" + b" " * 8, b""))
case("json_cut", "a header that stops inside the JSON", "not valid JSON", st(good[8:8 + n_good // 2]))
case("json_array", "a header that is a JSON array", "not a JSON object", st("[1, 2, 3]"))
case("invalid_utf8", "a header with a byte that is not UTF-8 in a name", "not valid JSON",
     st(b'{"a\xff": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', f32b(1.0)))
case("deep_nesting", "a header nested 1000 arrays deep", "nests JSON arrays and objects",
     st('{"__metadata__": {"x": ' + "[" * 1000 + "]" * 1000 + "}}"))
case("unknown_dtype", "a tensor of dtype F33", "unknown dtype", st({"a": t("F33", [2], 0, 8)}, f32b(1, 2)))
case("dtype_lowercase", "a tensor of dtype f32 (the spelling is F32)", "unknown dtype",
     st({"a": t("f32", [2], 0, 8)}, f32b(1, 2)))
case("dtype_not_string", "a dtype that is a number", "expected a string", st({"a": t(32, [2], 0, 8)}, f32b(1, 2)))
case("size_mismatch_short", "F32 [2, 3] (24 bytes) spanning 20 bytes", "needs 24 bytes but spans 20",
     st({"a": t("F32", [2, 3], 0, 20)}, bytes(20)))
case("size_mismatch_long", "I64 [2] (16 bytes) spanning 24 bytes", "needs 16 bytes but spans 24",
     st({"a": t("I64", [2], 0, 24)}, bytes(24)))
case("offsets_past_end", "a tensor ending 4 bytes past the data section", "truncated or corrupt",
     st({"a": t("F32", [3], 0, 12)}, f32b(1, 2)))
case("offsets_far_out", "offsets near 2^63", "truncated or corrupt",
     st({"a": t("F32", [1], 2**63, 2**63 + 4)}, f32b(1)))
case("offsets_reversed", "data_offsets [8, 0]", "truncated or corrupt", st({"a": t("F32", [0], 8, 0)}, f32b(1, 2)))
case("offset_negative", "a negative data offset", "negative", st({"a": t("F32", [1], -4, 0)}, f32b(1)))
case("offset_float", "a data offset written as 4.0", "expected a non-negative integer",
     st({"a": t("F32", [1], 0, 4.0)}, f32b(1)))
case("offsets_three", "data_offsets with three numbers", "expected [begin, end]",
     st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, f32b(1)))
case("no_offsets", "a tensor without data_offsets", "has no data_offsets",
     st({"a": {"dtype": "F32", "shape": [1]}}, f32b(1)))
case("overlap_same", "two tensors on the same 8 bytes", "overlap",
     st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 0, 8)}, f32b(1, 2)))
case("overlap_partial", "two tensors sharing 4 bytes", "overlap",
     st({"a": t("F32", [3], 0, 12), "b": t("F32", [3], 8, 20)}, f32b(1, 2, 3, 4, 5)))
case("hole", "4 bytes between two tensors", "belong to no tensor",
     st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, f32b(1, 2, 3)))
case("trailing_bytes", "a valid file followed by 3 bytes", "belong to no tensor", good + b"xyz")
case("duplicate_name", "the same tensor name twice in the header", "twice in one object",
     st(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', f32b(1, 2)))
case("duplicate_field", "a tensor whose dtype is given twice", "twice in one object",
     st(b'{"a": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}', f32b(1)))
case("negative_extent", "a shape with -1", "negative", st({"a": t("F32", [-1], 0, 4)}, f32b(1)))
case("float_extent", "a shape with 2.0", "expected a non-negative integer", st({"a": t("F32", [2.0], 0, 8)}, f32b(1, 2)))
case("shape_not_array", "a shape that is a number", "expected an array of extents",
     st({"a": t("F32", 2, 0, 8)}, f32b(1, 2)))
case("f4_odd", "3 F4 elements (12 bits) spanning 2 bytes: not a whole number of bytes", "byte boundary",
     st({"a": t("F4", [3], 0, 2)}, bytes(2)))
case("shape_overflow", "extents whose product overflows 64 bits", "too large",
     st({"a": t("F32", [2**32, 2**32, 2], 0, 8)}, f32b(1, 2)))
case("metadata_not_string", "__metadata__ with a number value", "expected a string",
     st({"__metadata__": {"epoch": 3}, "a": t("F32", [1], 0, 4)}, f32b(1)))
case("tensor_not_object", "a tensor described by a string", "expected an object",
     st({"a": "F32"}, b""))
case("bool_byte_2", "a BOOL element holding 2", "a BOOL element is 0 (false) or 1 (true)",
     st({"a": t("BOOL", [3], 0, 3)}, bytes([1, 2, 0])))
case("data_cut", "the valid file without its last 4 bytes", "truncated", good[:-4])

# the valid file cut at every length: each must be refused
for k in range(len(good)):
    case(f"cut_{k:04d}", f"the valid file cut to {k} of its {len(good)} bytes", "", good[:k])

manifest = []
for name, what, fragment, data in bad:
    path = os.path.join(out, "bad", name + ".safetensors")
    if data is None:  # sparse: 100 MB + 1 of header bytes (zeros) without writing them
        with open(path, "wb") as f:
            f.write(le64(100_000_001))
            f.truncate(8 + 100_000_001 + 8)
    else:
        with open(path, "wb") as f:
            f.write(data)
    # the package's own verdict (its reader, in Rust): does it refuse the file too?
    try:
        with safe_open(path, framework="numpy") as f:
            for k in f.keys():
                f.get_tensor(k)
        python = "loads"
    except Exception as e:  # noqa: BLE001 (SafetensorError, or an error of numpy's)
        python = "refuses: " + str(e)[:200]
    manifest.append({"file": name + ".safetensors", "what": what, "fragment": fragment, "python": python})
with open(os.path.join(out, "bad", "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)

lax = [m for m in manifest if m["python"] == "loads"]
print(f"wrote values, bf16 and other dtypes, {len(mlp)}-tensor MLPs and {len(manifest)} corrupt files to {out} "
      f"(safetensors {safetensors.__version__}, numpy {np.__version__})")
for m in lax:
    print(f"  note: the Python package itself loads {m['file']} ({m['what']}); locus must refuse it")

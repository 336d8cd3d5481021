#!/usr/bin/env python3
"""The adversarial suite: the type rules tried the way a hostile user would try them.

For every public operation that a rule guards, the cross product of devices (cpu,
pinned, cuda), dtypes and value categories (lvalue, const, rvalue, view, view of
const, slice, expression, temporary) is generated here:

  * each violation is its own translation unit (one `#if CASE == n` block of one
    generated file, compiled with -DCASE=n against a precompiled locus header) that
    must FAIL, with a first error line that matches the family's `locus:` message;
  * every legal twin goes into one translation unit that must COMPILE, so that no
    rejection passes for a wrong reason (a rule that rejects everything fails there);
  * trait checks (static_assert) sit in the legal unit: std::is_copy_constructible_v,
    std::is_convertible_v and friends must tell generic code the truth.

Usage: adversarial.py --compiler g++ --id gxx --include DIR [--include DIR ...]
       [--work DIR] [--jobs N] [--only SUBSTRING] [--list]
Prints one line per failure and closes with "adversarial: N passed, M failed".
The cases are plain data below; add a family when the API grows.
"""
import argparse
import concurrent.futures as cf
import os
import pathlib
import re
import subprocess
import sys

DEVICES = ["cpu", "pinned", "cuda"]
DTYPES = {"f32": "float", "f64": "double", "i32": "std::int32_t", "i64": "std::int64_t",
          "u8": "std::uint8_t", "bool": "bool", "f16": "locus::f16", "bf16": "locus::bf16"}
INTEGRAL = ["i32", "i64", "u8", "bool"]
NUMERIC = ["f32", "f64", "i32", "i64", "u8", "f16", "bf16"]


def ty(dt, dev, rank=1):
    return f"locus::tensor<{DTYPES[dt]}, locus::{dev}, {rank}>"


def vty(dt, dev, rank=1, const=False):
    c = "const " if const else ""
    return f"locus::tensor_view<{c}{DTYPES[dt]}, locus::{dev}, {rank}>"


def form(name, var, dt, dev, rank=1):
    """An operand of one value category, built from the lvalue tensor `var`."""
    return {
        "tensor": var,
        "const": f"std::as_const({var})",
        "view": f"{var}.view()",
        "cview": f"{vty(dt, dev, rank, True)}{{{var}}}",
        "slice": f"{var}.slice(0, 1)",
        "temporary": f"locus::empty<{DTYPES[dt]}, locus::{dev}>({{{', '.join(['1'] * rank)}}})",
        "xvalue": f"std::move({var})",
        "expr": f"({var} * {var})",
    }[name]


class Suite:
    def __init__(self):
        self.bad = []   # (family, name, params, stmt, regex)
        self.good = []  # (family, name, params, stmt)

    def reject(self, family, name, params, stmt, regex):
        self.bad.append((family, name, params, stmt, regex))

    def accept(self, family, name, params, stmt):
        self.good.append((family, name, params, stmt))


def build():
    s = Suite()
    P = lambda *ps: ", ".join(ps)

    # ---- 1. host access is the memory's device's to decide ------------------------------
    for f in ["tensor", "const", "view", "cview", "slice"]:
        for op, call in [("element", "(0)"), ("data", ".data()"), ("span", ".span()")]:
            x = form(f, "a", "f32", "cuda")
            s.reject("host access", f"{op} of a cuda {f}", P(f"{ty('f32', 'cuda')}& a"),
                     f"(void){x}{call};",
                     r"locus: element access, span\(\) and data\(\) need host-accessible memory")
            for d in ["cpu", "pinned"]:
                s.accept("host access", f"{op} of a {d} {f}", P(f"{ty('f32', d)}& a"),
                         f"(void){form(f, 'a', 'f32', d)}{call};")
    for f in ["tensor", "const", "view"]:
        s.reject("host access", f"item of a cuda {f}", P(f"{ty('f32', 'cuda', 0)}& a"),
                 f"(void){form(f, 'a', 'f32', 'cuda', 0)}.item();",
                 r"locus: element access, span\(\) and data\(\) need host-accessible memory")
    for d in DEVICES:
        for f in ["tensor", "const", "view"]:
            for op in ["data", "span", "item"]:
                rank = 0 if op == "item" else 1
                s.reject("host access", f"{op}<cpu>() of a {d} {f}", P(f"{ty('f32', d, rank)}& a"),
                         f"(void){form(f, 'a', 'f32', d, rank)}.{op}<locus::cpu>();",
                         rf"locus: {op}\(\) takes no device argument")

    # ---- 2. nothing points into a temporary ------------------------------------------
    tdtypes = ["f32", "i64", "bool", "bf16", "u8", "f16"]
    for di, d in enumerate(DEVICES):
        for ti, dt in enumerate(tdtypes):
            tmp = form("temporary", "", dt, d)
            ops_t = [("view()", ".view()"), ("slice()", ".slice(0, 1)"), ("reshape()", ".reshape({1})"),
                     ("span()", ".span()"), ("data()", ".data()")]
            # every (device, operation) once, the dtypes in turn
            for op, call in [o for k, o in enumerate(ops_t) if (k + di) % len(tdtypes) == ti]:
                s.reject("temporaries", f"{op} of a temporary {dt} {d} tensor", "",
                         f"auto v = {tmp}{call}; (void)v;",
                         r"locus: " + re.escape(op) + r" of a temporary tensor would dangle")
            s.reject("temporaries", f"a view bound to a temporary {dt} {d} tensor", "",
                     f"{vty(dt, d, 1, True)} v = {tmp}; (void)v;",
                     r"locus: a tensor_view of a temporary tensor would dangle")
            s.accept("temporaries", f"views of a named {dt} {d} tensor", "",
                     f"auto t = {tmp}; auto v = t.view(); auto w = t.slice(0, 1); auto r = t.reshape({{1}}); "
                     f"{vty(dt, d, 1, True)} c = t; (void)v; (void)w; (void)r; (void)c;")
        s.reject("temporaries", f"view() of a moved-from {d} tensor (xvalue)", P(f"{ty('f32', d)}& a"),
                 f"auto v = std::move(a).view(); (void)v;", r"locus: view\(\) of a temporary tensor would dangle")
        s.reject("temporaries", f"slice() of a const temporary {d} tensor", P(f"{ty('f32', d)}& a"),
                 f"auto v = static_cast<const {ty('f32', d)}&&>(a).slice(0, 1); (void)v;",
                 r"locus: slice\(\) of a temporary tensor would dangle")

    # ---- 3. operands of one expression share a device ---------------------------------
    ops = {"+": "{} + {}", "*": "{} * {}", "maximum": "locus::maximum({}, {})", "==": "{} == {}"}
    for da in DEVICES:
        for db in DEVICES:
            params = P(f"{ty('f32', da)}& a", f"{ty('f32', db)}& b")
            for on, pat in ops.items():
                for fa, fb in [("tensor", "tensor"), ("view", "expr"), ("expr", "view"), ("const", "slice")]:
                        stmt = "auto e = " + pat.format(form(fa, "a", "f32", da), form(fb, "b", "f32", db)) + "; (void)e;"
                        name = f"{fa} on {da} {on} {fb} on {db}"
                        if da == db:
                            s.accept("devices", name, params, stmt)
                        else:
                            s.reject("devices", name, params, stmt, r"locus: operands live on different devices")
            if da != db:
                s.reject("devices", f"where with the condition on {da}, values on {db}",
                         P(f"{ty('bool', da)}& c", f"{ty('f32', db)}& b"),
                         "auto e = locus::where(c, b, b); (void)e;", r"locus: .*different devices")
                s.reject("devices", f"a {db} tensor deep inside a {da} expression", params,
                         "auto e = locus::exp((a + a) * (a - a)) / locus::relu(a + b); (void)e;",
                         r"locus: operands live on different devices")

    # ---- 4. operands of one expression share a dtype ----------------------------------
    for ta in DTYPES:
        for tb in DTYPES:
            if ta == tb:
                continue
            params = P(f"{ty(ta, 'cpu')}& a", f"{ty(tb, 'cpu')}& b")
            combos = [("tensor", "tensor"), ("view", "view"), ("const", "slice")]
            k = list(DTYPES).index(ta) + list(DTYPES).index(tb)
            for fa, fb in [combos[k % 3]]:
                s.reject("dtypes", f"{fa} {ta} + {fb} {tb}", params,
                         f"auto e = {form(fa, 'a', ta, 'cpu')} + {form(fb, 'b', tb, 'cpu')}; (void)e;",
                         r"locus: operands have different dtypes")
    for t in NUMERIC:
        s.accept("dtypes", f"{t} + {t}", P(f"{ty(t, 'cpu')}& a", f"{ty(t, 'cpu')}& b"),
                 "auto e = a + b.view(); (void)e;")

    # ---- 5. no transfer hides in an assignment, conversion or view ----------------------
    for da in DEVICES:
        for db in DEVICES:
            params = P(f"{ty('f32', da)}& a", f"{ty('f32', db)}& b")
            cases = []
            for f in ["tensor", "const", "view"]:
                cases.append((f"tensor on {db} built from a {f} on {da}",
                              f"{ty('f32', db)} y = {form(f, 'a', 'f32', da)}; (void)y;",
                              r"locus: (cannot assign a|building a tensor from a tensor_view)"))
            for f in ["tensor", "const", "view", "slice"]:
                cases.append((f"view on {db} of a {f} on {da}",
                              f"{vty('f32', db, 1, True)} v = {form(f, 'a', 'f32', da)}; (void)v;",
                              r"locus: a view of \w+ memory cannot be a view of \w+ memory"))
            for f in ["tensor", "expr"]:
                cases.append((f"{db} tensor assigned a {f} on {da}", f"b = {form(f, 'a', 'f32', da)};",
                              r"locus: (cannot assign a|building a tensor from a tensor_view|operands live on different devices)"))
                cases.append((f"{db} tensor += a {f} on {da}", f"b += {form(f, 'a', 'f32', da)};",
                              r"locus: (cannot assign a|operands live on different devices)"))
                cases.append((f"{db} view assigned a {f} on {da}", f"b.view() = {form(f, 'a', 'f32', da)} + 1.0f;",
                              r"locus: (cannot assign a|operands live on different devices)"))
            for name, stmt, rx in cases:
                if da != db:
                    s.reject("transfers", name, params, stmt, rx)
            if da != db:
                s.reject("transfers", f"tensor on {db} built from a temporary on {da}", "",
                         f"{ty('f32', db)} y = {form('temporary', '', 'f32', da)}; (void)y;",
                         r"(use of deleted function|invokes a deleted function|call to deleted constructor)")
                s.accept("transfers", f"explicit transfer {da} -> {db}", params,
                         f"{ty('f32', db)} y = locus::to<locus::{db}>(a); locus::copy(a, b); "
                         f"locus::copy(a.view(), b.slice(0, b.extent(0))); (void)y;")

    # views that escape or change device on the way through a function or an assignment
    for d in DEVICES:
        s.reject("temporaries", f"a {d} view of a local tensor returned from a function", "",
                 f"auto make = []() -> {vty('f32', d, 1, True)} {{ auto t = locus::empty<float, locus::{d}>({{2}}); return t; }}; (void)make;",
                 r"locus: a tensor_view of a temporary tensor would dangle")
    for da, db in [("cuda", "cpu"), ("cpu", "cuda"), ("pinned", "cpu"), ("cuda", "pinned")]:
        params = P(f"{ty('f32', da)}& a", f"{vty('f32', db, 1, True)}& v",
                   f"const std::function<void({vty('f32', db, 1, True)})>& cb")
        s.reject("transfers", f"a {db} view assigned a {da} view", params, "v = a.view();",
                 r"locus: a view of \w+ memory cannot be a view of \w+ memory")
        s.reject("transfers", f"a {da} tensor passed to a std::function of {db} views", params, "cb(a);",
                 r"locus: a view of \w+ memory cannot be a view of \w+ memory")
        s.reject("transfers", f"a {da} slice passed to a function of {db} views", params,
                 f"auto take = []({vty('f32', db, 1, True)}) {{}}; take(a.slice(0, 1));",
                 r"locus: a view of \w+ memory cannot be a view of \w+ memory")
        s.accept("transfers", f"a {db} view of a transferred {da} tensor", params,
                 f"auto h = locus::to<locus::{db}>(a); v = h.view(); cb(h); cb(h.slice(0, 1));")

    # ---- 6. no dtype conversion hides anywhere ------------------------------------------
    pairs = [("f32", "f64"), ("f64", "f32"), ("f32", "i32"), ("i32", "f32"), ("f32", "bf16"),
             ("bf16", "f32"), ("u8", "bool"), ("bool", "u8"), ("i64", "i32"), ("f16", "bf16")]
    for ta, tb in pairs:
        params = P(f"{ty(ta, 'cpu')}& a", f"{ty(tb, 'cpu')}& b")
        s.reject("dtype conversions", f"{tb} tensor built from a {ta} tensor", params,
                 f"{ty(tb, 'cpu')} y = a; (void)y;", r"locus: copy between different dtypes")
        s.reject("dtype conversions", f"{tb} tensor built from a {ta} view", params,
                 f"{ty(tb, 'cpu')} y = a.view(); (void)y;", r"locus: copy between different dtypes")
        s.reject("dtype conversions", f"{tb} view of a {ta} tensor", params,
                 f"{vty(tb, 'cpu', 1, True)} v = a; (void)v;", r"locus: a view of \w+ elements cannot be a view of \w+ elements")
        s.reject("dtype conversions", f"{tb} view of a {ta} view", params,
                 f"{vty(tb, 'cpu', 1, True)} v = a.view(); (void)v;", r"locus: a view of \w+ elements cannot be a view of \w+ elements")
        s.reject("dtype conversions", f"copy {ta} -> {tb}", params, "locus::copy(a, b);",
                 r"locus: copy between different dtypes")
        s.reject("dtype conversions", f"copy {ta} view -> {tb} view", params, "locus::copy(a.view(), b.view());",
                 r"locus: copy between different dtypes")
        s.accept("dtype conversions", f"explicit cast {ta} -> {tb}", params, f"b = locus::cast<{DTYPES[tb]}>(a);")

    # ---- 7. no rank change hides in a conversion ----------------------------------------
    params = P(f"{ty('f32', 'cpu')}& a", f"{ty('f32', 'cpu', 2)}& m")
    s.reject("ranks", "rank-2 tensor built from a rank-1 tensor", params, f"{ty('f32', 'cpu', 2)} y = a; (void)y;", r"locus: destination has rank 2 but the source has rank 1")
    s.reject("ranks", "rank-2 view of a rank-1 tensor", params, f"{vty('f32', 'cpu', 2)} v = a; (void)v;", r"locus: a rank-1 tensor or view cannot be a rank-2 view")
    s.reject("ranks", "rank-1 view of a rank-2 view", params, f"{vty('f32', 'cpu', 1, True)} v = m.view(); (void)v;", r"locus: a rank-2 tensor or view cannot be a rank-1 view")
    s.reject("ranks", "copy rank 1 -> rank 2", params, "locus::copy(a, m);", r"locus: copy between tensors of different rank")
    s.accept("ranks", "explicit reshape", params, f"{vty('f32', 'cpu', 2)} v = a.reshape({{1, a.numel()}}); locus::copy(m.reshape({{m.numel()}}), a); (void)v;")

    # ---- 8. nothing writes through const ------------------------------------------------
    for d in DEVICES:
        params = P(f"{ty('f32', d)}& a", f"{ty('f32', d)}& c")
        for name, dst in [("std::as_const(tensor)", "std::as_const(c)"),
                          ("view of const", f"{vty('f32', d, 1, True)}(c)")]:
            s.reject("const", f"copy into a {name} on {d}", params, f"locus::copy(a, {dst});", r"locus: .*const")
        s.reject("const", f"expression assigned to a view of const on {d}", params,
                 f"{vty('f32', d, 1, True)}{{c}} = a + a;", r"locus: .*const")
        s.reject("const", f"+= on a view of const on {d}", params, f"{vty('f32', d, 1, True)}{{c}} += a;", r"locus: .*const")
        s.accept("const", f"copy into a mutable tensor and view on {d}", params, "locus::copy(a, c); locus::copy(a.view(), c.view());")
    mparams = P(f"{ty('f32', 'cpu', 2)}& a", f"{ty('f32', 'cpu', 2)}& c")
    s.reject("const", "matmul_into a const tensor", mparams, "locus::matmul_into(std::as_const(c), a, a);", r"locus: matmul_into destination is const")
    s.reject("const", "matmul_into a view of const", mparams, f"locus::matmul_into({vty('f32', 'cpu', 2, True)}(c), a, a);", r"locus: matmul_into destination is const")
    s.accept("const", "matmul_into a mutable tensor", mparams, "locus::matmul_into(c, a, a); locus::matmul_into(c.view(), a, a);")

    # ---- 9. raw pointers enter through one door ----------------------------------------
    for da in DEVICES:
        for db in DEVICES:
            params = P(f"{ty('f32', da)}& a")
            s.reject("raw pointers", f"{db} view constructed from a {da} tensor's pointer", params,
                     f"{vty('f32', db)} v(a.data_handle(), {{1}}); (void)v;", r"locus: a raw pointer becomes a view only through locus::unsafe_view")
            s.reject("raw pointers", f"strided {db} view constructed from a {da} tensor's pointer", params,
                     f"{vty('f32', db)} v(a.data_handle(), {{1}}, {{1}}); (void)v;", r"locus: a raw pointer becomes a view only through locus::unsafe_view")
        s.accept("raw pointers", f"unsafe_view<{da}>", P(f"{ty('f32', da)}& a"),
                 f"auto v = locus::unsafe_view<locus::{da}>(a.data_handle(), {{a.numel()}}); (void)v;")

    # ---- 10. copies of tensors are explicit ---------------------------------------------
    for d in DEVICES:
        params = P(f"{ty('f32', d)}& a", f"{ty('f32', d)}& b")
        s.reject("copies", f"copy-construct a {d} tensor", params, f"{ty('f32', d)} y = a; (void)y;", r"locus: tensor is move-only")
        s.reject("copies", f"copy-assign a {d} tensor", params, "b = a;", r"locus: tensor is move-only")
        s.reject("copies", f"pass a {d} tensor by value", params, f"auto sink = []({ty('f32', d)}) {{}}; sink(a);", r"locus: tensor is move-only")
        s.reject("copies", f"copy-construct a const {d} tensor", params, f"{ty('f32', d)} y = std::as_const(a); (void)y;",
                 r"(use of deleted function|call to deleted constructor)")
        s.accept("copies", f"clone, move and view a {d} tensor", params,
                 f"{ty('f32', d)} y = a.clone(); {ty('f32', d)} z = std::move(b); auto v = a.view(); (void)y; (void)z; (void)v;")

    # ---- 11. swap keeps types -----------------------------------------------------------
    for (ta, da), (tb, db) in [(("f32", "cpu"), ("f32", "cuda")), (("f32", "cuda"), ("f32", "pinned")),
                               (("f32", "cpu"), ("f64", "cpu")), (("bf16", "cuda"), ("f16", "cuda"))]:
        s.reject("swap", f"swap {ta} {da} with {tb} {db}", P(f"{ty(ta, da)}& a", f"{ty(tb, db)}& b"),
                 "using std::swap; swap(a, b);", r"locus: cannot swap tensors of different devices, dtypes or ranks")
    s.accept("swap", "swap of one type", P(f"{ty('f32', 'cuda')}& a", f"{ty('f32', 'cuda')}& b"), "using std::swap; swap(a, b); std::swap(a, b);")

    # ---- 12. printing reads host memory only -------------------------------------------
    for f in ["tensor", "const", "view", "slice"]:
        s.reject("printing", f"print a cuda {f}", P(f"{ty('f32', 'cuda')}& a"), f"std::cout << {form(f, 'a', 'f32', 'cuda')};",
                 r"locus: only host memory prints, but this tensor lives on cuda")
        for d in ["cpu", "pinned"]:
            s.accept("printing", f"print a {d} {f}", P(f"{ty('f32', d)}& a"), f"std::cout << {form(f, 'a', 'f32', d)};")
    s.reject("printing", "print an expression", P(f"{ty('f32', 'cpu')}& a"), "std::cout << a + a;", r"locus: an expression is lazy")

    # ---- 13. matmul operands ------------------------------------------------------------
    for da, db in [("cpu", "cuda"), ("cuda", "pinned"), ("pinned", "cpu")]:
        s.reject("matmul", f"matmul {da} x {db}", P(f"{ty('f32', da, 2)}& a", f"{ty('f32', db, 2)}& b"),
                 "auto c = locus::matmul(a, b); (void)c;", r"locus: .*different devices")
    for ta, tb in [("f32", "f64"), ("bf16", "f32"), ("f16", "bf16")]:
        s.reject("matmul", f"matmul {ta} x {tb}", P(f"{ty(ta, 'cpu', 2)}& a", f"{ty(tb, 'cpu', 2)}& b"),
                 "auto c = locus::matmul(a, b); (void)c;", r"locus: matmul operands have different dtypes")
    for t in ["i32", "i64", "u8", "bool"]:
        s.reject("matmul", f"matmul of {t}", P(f"{ty(t, 'cpu', 2)}& a"), "auto c = locus::matmul(a, a); (void)c;", r"locus: .*matmul")
    s.reject("matmul", "matmul of a temporary transposed", P(f"{ty('f32', 'cpu', 2)}& a"),
             "auto c = locus::matmul(a, locus::transpose(locus::empty<float, locus::cpu>({2, 2}))); (void)c;", r"locus: ")

    # ---- 14. explicit transfers of expressions --------------------------------------------
    for da in DEVICES:
        for db in DEVICES:
            s.reject("expressions", f"to<{db}> of a {da} expression", P(f"{ty('f32', da)}& a"),
                     f"auto y = locus::to<locus::{db}>(a * 2.0f); (void)y;", r"locus: .*locus::eval")
        s.reject("expressions", f"copy of a {da} expression", P(f"{ty('f32', da)}& a", f"{ty('f32', da)}& b"),
                 "locus::copy(a * 2.0f, b);", r"locus: ")
    # ---- 15. scalars never change a tensor's dtype silently --------------------------
    scalars = {"float": "0.5f", "double": "0.5", "locus::f16": "locus::f16(0.5f)", "locus::bf16": "locus::bf16(0.5f)"}
    sops = [("*", "auto e = {x} * {s}; (void)e;"), ("+", "auto e = {s} + {x}; (void)e;"),
            (">", "auto e = {x} > {s}; (void)e;"), ("maximum", "auto e = locus::maximum({x}, {s}); (void)e;"),
            ("where", "auto e = locus::where({x} == {x}, {x}, {s}); (void)e;"), ("+=", "a += {s};")]
    k = 0
    for t in INTEGRAL:
        for sn, sv in scalars.items():
            for on, pat in sops:
                f = ["tensor", "view", "slice"][k % 3]
                k += 1
                x = form(f, "a", t, "cpu")
                s.reject("scalars", f"{sn} scalar {on} a {t} {f}", P(f"{ty(t, 'cpu')}& a"), pat.format(x=x, s=sv),
                         r"locus: a floating-point scalar \(" + re.escape(sn) + r"\) with an? " + t + " tensor")
        if t != "bool":
            s.accept("scalars", f"integer scalars with a {t} tensor", P(f"{ty(t, 'cpu')}& a"),
                     "auto e = a * 2 + 1; auto c = a > 3; auto m = locus::maximum(a, 7); a += 1; (void)e; (void)c; (void)m;")
        s.accept("scalars", f"a {t} tensor cast to f32 first", P(f"{ty(t, 'cpu')}& a"),
                 "auto e = locus::cast<float>(a) * 0.5f; auto c = locus::cast<float>(a) > 10.5f; (void)e; (void)c;")
    for t in ["f32", "f64", "f16", "bf16"]:
        s.accept("scalars", f"floating scalars with a {t} tensor", P(f"{ty(t, 'cpu')}& a"),
                 "auto e = a * 0.5f + 2.0; auto c = a > 10.5f; a *= 0.25; (void)e; (void)c;")

    # ---- 16. asynchronous copies: the pending owns what the copy touches ---------------
    T = "float"
    pin, dev = ty("f32", "pinned"), ty("f32", "cuda")
    params = P(f"{pin}& h", f"{dev}& d", f"{dev}& g")
    for name, stmt, rx in [
        ("copy_async into an lvalue cuda tensor", "auto p = locus::copy_async(g, d);",
         r"locus: copy_async takes ownership of its destination, but dst is an lvalue tensor"),
        ("copy_async into an lvalue pinned tensor", "auto p = locus::copy_async(g, h);",
         r"locus: copy_async takes ownership of its destination, but dst is an lvalue tensor"),
        ("copy_async into a const cuda tensor", "auto p = locus::copy_async(g, std::move(std::as_const(d)));",
         r"locus: copy_async destination is const"),
        ("copy_async into a cuda view", "auto p = locus::copy_async(g, d.view());",
         r"locus: the destination of copy_async is a tensor_view, which the pending cannot own"),
        ("copy_async into a slice", "auto p = locus::copy_async(g.slice(0, 1), d.slice(0, 1));",
         r"locus: the destination of copy_async is a tensor_view, which the pending cannot own"),
        ("copy_async from an lvalue pinned tensor", "auto p = locus::copy_async(h, std::move(d));",
         r"locus: the source of an asynchronous copy is a pinned tensor passed as an lvalue"),
        ("copy_async from a const pinned tensor", "auto p = locus::copy_async(std::as_const(h), std::move(d));",
         r"locus: the source of an asynchronous copy is a pinned tensor"),
        ("copy_async from a pinned view", "auto p = locus::copy_async(h.view(), std::move(d));",
         r"locus: the source of an asynchronous copy is a pinned tensor_view, which the pending cannot own"),
        ("to_async from an lvalue pinned tensor", "auto p = locus::to_async<locus::cuda>(h);",
         r"locus: the source of an asynchronous copy is a pinned tensor passed as an lvalue"),
        ("to_async from a pinned slice", "auto p = locus::to_async<locus::cuda>(h.slice(0, 1));",
         r"locus: the source of an asynchronous copy is a pinned tensor_view"),
        ("to_async from pageable memory", f"{ty('f32', 'cpu')} c; auto p = locus::to_async<locus::cuda>(std::move(c));",
         r"locus: to_async and copy_async need page-locked host memory, but the source is cpu"),
        ("to_async to pageable memory", "auto p = locus::to_async<locus::cpu>(g);",
         r"locus: to_async and copy_async need page-locked host memory, but the destination is cpu"),
        ("to_async of an expression", "auto p = locus::to_async<locus::pinned>(g * 2.0f);",
         r"locus: to_async and copy_async copy a tensor, but the source is an expression"),
        ("pending dereferenced", "auto p = locus::to_async<locus::pinned>(g); (void)*p;", r"locus: .*get\(\)"),
        ("pending converted to a tensor", f"auto p = locus::to_async<locus::pinned>(g); {pin} x = p; (void)x;", r"locus: .*get\(\)"),
        ("pending copied", "auto p = locus::to_async<locus::pinned>(g); auto q = p; (void)q;",
         r"(locus: pending is move-only|use of deleted function|call to deleted constructor)"),
    ]:
        s.reject("async", name, params, stmt + " (void)p;" if "auto p" in stmt and "(void)p" not in stmt else stmt, rx)
    s.accept("async", "copies that own what they touch", params,
             "auto p = locus::to_async<locus::cuda>(std::move(h)); auto [x, back] = std::move(p).get_with_source(); "
             "auto q = locus::copy_async(g, std::move(d)); d = std::move(q).get(); auto r = locus::to_async<locus::pinned>(g.view()); "
             "(void)x; (void)back; (void)r;")
    return s


CASE_FILE_HEAD = """// GENERATED by tests/adversarial/adversarial.py: one violation per CASE.
#include "prelude.hpp"
"""


def write_sources(s, work):
    work.mkdir(parents=True, exist_ok=True)
    (work / "prelude.hpp").write_text(
        "#pragma once\n#include <cstdint>\n#include <functional>\n#include <optional>\n#include <iostream>\n#include <utility>\n"
        "#include <locus/locus.hpp>\n")
    lines = [CASE_FILE_HEAD]
    for i, (fam, name, params, stmt, _) in enumerate(s.bad):
        lines.append(f"#if CASE == {i}\n// {fam}: {name}\nvoid adversarial_case({params}) {{ {stmt} }}\n#endif\n")
    (work / "reject.cpp").write_text("".join(lines))
    good = [CASE_FILE_HEAD.replace("one violation per CASE", "every legal twin, which must compile"),
            TRAITS]
    for i, (fam, name, params, stmt) in enumerate(s.good):
        good.append(f"// {fam}: {name}\nvoid legal_{i}({params}) {{ {stmt} }}\n")
    (work / "accept.cpp").write_text("".join(good))


TRAITS = """
// Traits tell generic code the truth about tensors.
using H1 = locus::tensor<float, locus::cpu, 1>;
static_assert(!std::is_copy_constructible_v<H1> && !std::is_copy_assignable_v<H1>);
static_assert(std::is_nothrow_move_constructible_v<H1> && std::is_nothrow_move_assignable_v<H1>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cuda, 1>, H1>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::pinned, 1>, H1>);
static_assert(!std::is_convertible_v<locus::tensor<double, locus::cpu, 1>, H1>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cpu, 2>, H1>);
static_assert(!std::is_constructible_v<H1, locus::tensor<float, locus::cuda, 1>>);
static_assert(!std::is_copy_constructible_v<std::optional<H1>>);
static_assert(std::is_convertible_v<H1&, locus::tensor_view<const float, locus::cpu, 1>>);
static_assert(std::is_trivially_copyable_v<locus::tensor_view<float, locus::cuda, 2>>);
"""


def compile_cmd(args, work, extra):
    base = [args.compiler, "-std=c++20", "-fsyntax-only"] + [f"-I{i}" for i in args.include]
    if args.id == "clang":
        return base + ["-include-pch", str(work / "prelude.hpp.pch")] + extra
    return base + ["-include", str(work / "prelude.hpp")] + extra


def first_error(text):
    for line in text.splitlines():
        if "error:" in line:
            return line
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--id", required=True, help="gxx or clang")
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("--work", default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default=None, help="run only the cases whose family or name holds this text")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    s = build()
    if args.only:
        s.bad = [c for c in s.bad if args.only in c[0] or args.only in c[1]]
        s.good = [c for c in s.good if args.only in c[0] or args.only in c[1]]
    if args.list:
        for fam, name, *_ in s.bad:
            print(f"reject  {fam}: {name}")
        for fam, name, *_ in s.good:
            print(f"accept  {fam}: {name}")
        print(f"{len(s.bad)} violations, {len(s.good)} legal twins")
        return 0
    work = pathlib.Path(args.work or f"adversarial-{args.id}").resolve()
    write_sources(s, work)
    # The precompiled prelude: every case then parses only its own lines.
    pch = ["-x", "c++-header", str(work / "prelude.hpp"), "-o",
           str(work / ("prelude.hpp.pch" if args.id == "clang" else "prelude.hpp.gch"))]
    r = subprocess.run([args.compiler, "-std=c++20"] + [f"-I{i}" for i in args.include] + pch,
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        print("adversarial: 0 passed, 1 failed (the precompiled prelude did not build)")
        return 1

    failures = []

    def run_bad(i):
        fam, name, _, _, rx = s.bad[i]
        p = subprocess.run(compile_cmd(args, work, [f"-DCASE={i}", str(work / "reject.cpp")]),
                           capture_output=True, text=True)
        out = p.stdout + p.stderr
        first = first_error(out)
        if p.returncode == 0:
            return f"COMPILED  {fam}: {name} (expected: {rx})"
        if not re.search(rx, first):
            return f"WRONG     {fam}: {name}\n  expected: {rx}\n  first error: {first.strip()[:400]}"
        return None

    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for msg in pool.map(run_bad, range(len(s.bad))):
            if msg:
                failures.append(msg)
                print(msg, flush=True)
    passed = len(s.bad) - len(failures)

    p = subprocess.run(compile_cmd(args, work, [str(work / "accept.cpp")]), capture_output=True, text=True)
    if p.returncode == 0:
        passed += len(s.good)
        good_failed = 0
    else:
        # Name the legal twins the compiler rejected (the lines of its errors).
        bad_lines = set(int(m) for m in re.findall(r"accept\.cpp:(\d+):\d+: error", p.stdout + p.stderr))
        src = (work / "accept.cpp").read_text().splitlines()
        names = sorted({src[n - 2] for n in bad_lines if n >= 2 and src[n - 2].startswith("//")})
        print("REJECTED legal twins (they must compile):\n  " + "\n  ".join(names or ["(see the output)"]))
        print("\n".join((p.stdout + p.stderr).splitlines()[:40]))
        good_failed = max(1, len(names))
        passed += len(s.good) - good_failed
    failed = len(failures) + good_failed
    print(f"{len(s.bad)} violations, {len(s.good)} legal twins [{args.id}]")
    print(f"adversarial: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

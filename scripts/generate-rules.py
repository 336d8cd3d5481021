#!/usr/bin/env python3
"""Writes include/locus/core/rules_pairs.hpp: the pairwise branches of the type rules.

A static_assert message must be a string literal in C++20, so a diagnostic that names
both dtypes (or ranks, or devices) needs one branch per pair. They are written out
here rather than expanded from macros, because g++ prints an "in expansion of macro"
note per macro level, which would push the first-error output past 25 lines.
Run: python3 scripts/generate-rules.py
"""
import pathlib

DTYPES = [("float", "f32"), ("double", "f64"), ("std::int32_t", "i32"), ("std::int64_t", "i64"),
          ("std::uint8_t", "u8"), ("bool", "bool"), ("::locus::f16", "f16"), ("::locus::bf16", "bf16")]
RANKS = range(9)
DEVICES = ["cpu", "pinned", "cuda"]

RULES = []

def article(name):
    """'an f32', 'an i64', 'a u8', 'a bf16', 'a bool': as the names are read aloud."""
    return "an" if name[0] in "fi" else "a"

def spell(name):
    """How a dtype is written in user code (the message's suggestion must compile)."""
    return name if name == "bool" else f"locus::{name}"

def dtype_rule(name, msg, fallback, comment):
    pairs = []
    for ta, na in DTYPES:
        for tb, nb in DTYPES:
            if ta != tb:
                pairs.append((f"std::is_same_v<A, {ta}> && std::is_same_v<B, {tb}>", msg(na, nb)))
    text = [f"// {comment}", "template <class A0, class B0>", f"constexpr bool {name}() {{",
            "  using A = std::remove_cv_t<A0>;", "  using B = std::remove_cv_t<B0>;",
            "  if constexpr (std::is_same_v<A, B>) {", "    return true;"]
    for cond, m in pairs:
        text += [f"  }} else if constexpr ({cond}) {{", f"    static_assert(always_false<A>, \"{m}\");", "    return false;"]
    text += ["  } else {", f"    static_assert(always_false<A>, \"{fallback}\");", "    return false;", "  }", "}", ""]
    RULES.append("\n".join(text))

def rank_rule(name, msg, fallback, comment):
    text = [f"// {comment}", "template <std::size_t A, std::size_t B>", f"constexpr bool {name}() {{",
            "  if constexpr (A == B) {", "    return true;"]
    for a in RANKS:
        for b in RANKS:
            if a != b:
                text += [f"  }} else if constexpr (A == {a} && B == {b}) {{",
                         f"    static_assert(always_false_v<A>, \"{msg(a, b)}\");", "    return false;"]
    text += ["  } else {", f"    static_assert(always_false_v<A>, \"{fallback}\");", "    return false;", "  }", "}", ""]
    RULES.append("\n".join(text))

def device_rule(name, params, msg, fallback, comment):
    a, b = params
    text = [f"// {comment}", f"template <class {a}, class {b}>", f"constexpr bool {name}() {{",
            f"  if constexpr (std::is_same_v<{a}, {b}>) {{", "    return true;"]
    for da in DEVICES:
        for db in DEVICES:
            if da != db:
                text += [f"  }} else if constexpr (std::is_same_v<{a}, {da}> && std::is_same_v<{b}, {db}>) {{",
                         f"    static_assert(always_false<{a}>, \"{msg(da, db)}\");", "    return false;"]
    text += ["  } else {", f"    static_assert(always_false<{a}>, \"{fallback}\");", "    return false;", "  }", "}", ""]
    RULES.append("\n".join(text))

dtype_rule("require_same_operand_dtype",
           lambda a, b: f"locus: operands have different dtypes ({a} and {b}); convert one explicitly with locus::cast<{spell(b)}>(x) or locus::cast<{spell(a)}>(y)",
           "locus: operands have different dtypes; convert one with locus::cast<T>(x)",
           "Prevents: silent promotion or reinterpretation when two dtypes meet in one operation.")
dtype_rule("require_assign_dtype",
           lambda a, b: f"locus: cannot assign {article(a)} {a} expression to {article(b)} {b} tensor; dtypes never convert silently: write dst = locus::cast<{spell(b)}>(e)",
           "locus: cannot assign an expression of another dtype; convert it with locus::cast<T>(e)",
           "Prevents: a silent conversion when an expression is written into a tensor of another dtype (A: source, B: destination).")
dtype_rule("require_matmul_dtype",
           lambda a, b: f"locus: matmul operands have different dtypes ({a} and {b}); convert one into a tensor first: locus::eval(locus::cast<{spell(b)}>(a)) or locus::eval(locus::cast<{spell(a)}>(b))",
           "locus: matmul operands have different dtypes; convert one with locus::eval(locus::cast<T>(x))",
           "Prevents: a GEMM over operands of different dtypes (A: left, B: right).")
dtype_rule("require_bias_dtype",
           lambda a, b: f"locus: linear's bias is {a} but its output is {b}; the bias is added in the output dtype: pass a {b} bias, e.g. locus::eval(locus::cast<{spell(b)}>(bias)) (f16 or bf16 inputs with an f32 bias: locus::linear<float>(x, w, bias))",
           "locus: linear's bias must have the output dtype",
           "Prevents: a bias added in another dtype than the output's (A: bias, B: output).")
dtype_rule("require_same_copy_dtype",
           lambda a, b: f"locus: copy between different dtypes ({a} to {b}); copy moves bytes and never converts: write dst = locus::cast<{spell(b)}>(src) on one device, or locus::copy(locus::eval(locus::cast<{spell(b)}>(src)), dst)",
           "locus: copy between different dtypes; cast first with locus::cast<T>(src)",
           "Prevents: a byte copy between buffers whose elements mean different things.")
rank_rule("require_same_copy_rank",
          lambda a, b: f"locus: copy between tensors of different rank ({a} and {b}); reshape one side first, e.g. locus::copy(src.reshape(dst.shape()), dst)",
          "locus: copy between tensors of different rank; reshape one side first",
          "Prevents: a flat copy between tensors of different rank.")
rank_rule("require_assign_rank",
          lambda a, b: f"locus: destination has rank {a} but the source has rank {b}; reshape the destination or the source",
          "locus: destination and source ranks differ; reshape one side",
          "Prevents: assigning a value of another rank (A: destination, B: source).")
device_rule("require_same_operand_device", ("A", "B"),
            lambda a, b: f"locus: operands live on different devices ({a} and {b}); transfers are explicit: move one with locus::to<locus::{a}>(x) or locus::to<locus::{b}>(y) (an expression: locus::eval it first)",
            "locus: operands live on different devices; move one with locus::to<D>(x)",
            "Prevents: 'Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu'.")
device_rule("require_assign_device", ("S", "T"),
            lambda s, t: f"locus: cannot assign a {s} tensor or expression to a {t} tensor; transfers are explicit: write locus::to<locus::{t}>(x) (an expression: locus::to<locus::{t}>(locus::eval(e)), evaluated on {s}), or locus::copy(src, dst)",
            "locus: cannot assign across devices; write locus::to<D>(x)",
            "Prevents: a device transfer (and its synchronisation) hidden in an assignment (S: source, T: destination).")

# --- scalars with integer and bool tensors (owner: scalars) ---------------------------
FLOAT_SCALARS = [("float", "float", "0.5f", "float"), ("double", "double", "0.5", "double"),
                 ("long double", "long double", "0.5L", "double"),
                 ("::locus::f16", "locus::f16", "locus::f16(0.5f)", "float"),
                 ("::locus::bf16", "locus::bf16", "locus::bf16(0.5f)", "float")]
INT_DTYPES = [(t, n) for t, n in DTYPES if n in ("i32", "i64", "u8", "bool")]

def scalar_dtype_rule():
    text = ["// Prevents: a floating scalar silently converted to an integer or bool tensor's dtype",
            "// (i32 * 0.5f == 0, i32 > 10.5f comparing with 10). S: the scalar, T: the tensor's dtype.",
            "template <class S0, class T0>", "constexpr bool require_scalar_dtype() {",
            "  using S = std::remove_cvref_t<S0>;", "  using T = std::remove_cv_t<T0>;",
            "  if constexpr (!(std::is_floating_point_v<S> || is_half_v<S>) || dtype_traits<T>::is_floating) {",
            "    return true;"]
    for ts, ss, lit, ct in FLOAT_SCALARS:
        for tt, nt in INT_DTYPES:
            lost = "true or false" if nt == "bool" else "a whole number"
            m = (f"locus: a floating-point scalar ({ss}) with {article(nt)} {nt} tensor would be converted to {nt}, "
                 f"becoming {lost}; dtypes never convert silently: convert the tensor explicitly, e.g. "
                 f"locus::cast<{ct}>(t) * {lit} (into t itself: t = locus::cast<{spell(nt)}>(locus::cast<{ct}>(t) * {lit})), "
                 f"or use an integer scalar")
            text += [f"  }} else if constexpr (std::is_same_v<S, {ts}> && std::is_same_v<T, {tt}>) {{",
                     f"    static_assert(always_false<S>, \"{m}\");", "    return false;"]
    text += ["  } else {",
             "    static_assert(always_false<S>, \"locus: a floating-point scalar with an integer or bool tensor would lose its fraction; convert the tensor with locus::cast<float>(t)\");",
             "    return false;", "  }", "}", ""]
    RULES.append("\n".join(text))

scalar_dtype_rule()
# --- end of scalars' block ---------------------------------------------------------------

# ---- views (lead): a view never reinterprets, transfers or reshapes memory by conversion ----
device_rule("require_view_device", ("S", "T"),
            lambda s, t: f"locus: a view of {s} memory cannot be a view of {t} memory; transfers are explicit: auto h = locus::to<locus::{t}>(x); then use h (or h.view())",
            "locus: a view of one device's memory cannot be a view of another's; write locus::to<D>(x)",
            "Prevents: a pointer to GPU memory typed as host memory by a view conversion (S: source, T: target view).")
dtype_rule("require_view_dtype",
           lambda a, b: f"locus: a view of {a} elements cannot be a view of {b} elements; views never reinterpret memory: make a converted tensor with locus::eval(locus::cast<{spell(b)}>(x))",
           "locus: a view of one dtype cannot be a view of another; convert with locus::eval(locus::cast<T>(x))",
           "Prevents: reinterpreting elements by a view conversion (A: source, B: target view).")
rank_rule("require_view_rank",
          lambda a, b: f"locus: a rank-{a} tensor or view cannot be a rank-{b} view; write x.reshape({{...}}) with {b} extents",
          "locus: a view of another rank; write x.reshape({...})",
          "Prevents: a view of another rank by conversion (A: source, B: target view).")

LENGTH = '''//
// Length (over 600 lines): generated, one static_assert per pair of the rules' tables;
// nobody edits it by hand.
'''
header = '''// GENERATED by scripts/generate-rules.py -- do not edit; edit the script and rerun it.
// The pairwise branches of the type rules (see rules.hpp): one static_assert per pair,
// so that the message names both dtypes, ranks or devices.
''' + LENGTH + '''#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device.hpp"
#include "dtype.hpp"

namespace locus::detail {

'''
CORE_RULES = len(RULES)
device_rule("require_batch_on_model_device", ("B", "M"),
            lambda b, m: f"locus: the batch lives on {b} but the model on {m}; model, batch and labels share one device: move the batch with locus::to<locus::{m}>(x) or build the loader as locus::data::loader<locus::{m}>",
            "locus: the batch lives on another device than the model; move it with locus::to<D>(x)",
            "Prevents: 'Expected all tensors to be on the same device' at the first training step (B: batch, M: model).")
device_rule("require_optimizer_on_model_device", ("O", "M"),
            lambda o, m: f"locus: the optimizer keeps its state on {o} but the model lives on {m}; build it for the model's device: locus::optim::adamw<locus::{m}> (or sgd<locus::{m}>)",
            "locus: the optimizer is built for another device than the model",
            "Prevents: optimizer state left on another device than the model (O: optimizer, M: model).")
device_rule("require_scaler_on_model_device", ("S", "M"),
            lambda s, m: f"locus: the grad scaler lives on {s} but the model on {m}; build it as locus::amp::grad_scaler<locus::{m}>",
            "locus: the grad scaler is built for another device than the model",
            "Prevents: a loss scale that must cross devices every step (S: scaler, M: model).")
device_rule("require_layers_same_device", ("A", "B"),
            lambda a, b: f"locus: a sequential model mixes layers on {a} and {b}; every layer of one model lives on one device: build them all with the same device parameter",
            "locus: a sequential model mixes layers on different devices",
            "Prevents: a model split across devices by accident (A: first layer, B: another layer).")

root = pathlib.Path(__file__).resolve().parent.parent / "include/locus/core"
out = header + "\n".join(RULES[:CORE_RULES]) + "}  // namespace locus::detail\n"
(root / "rules_pairs.hpp").write_text(out)
print(f"wrote {root / 'rules_pairs.hpp'} ({out.count(chr(10))} lines)")
# The training rules live apart, so that files which only compute do not parse them.
train = header.replace(LENGTH, "").replace("#include \"device.hpp\"", "#include \"config.hpp\"\n#include \"device.hpp\"") + "\n".join(RULES[CORE_RULES:]) + "}  // namespace locus::detail\n"
(root / "rules_train.hpp").write_text(train)
print(f"wrote {root / 'rules_train.hpp'} ({train.count(chr(10))} lines)")

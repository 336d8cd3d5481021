#!/usr/bin/env python3
"""Writes every ```cpp block of the given Markdown files into OUT_DIR as a translation unit.

    extract_snippets.py OUT_DIR FILE.md...

A block whose first line is a comment naming a `.cu` file (`// app.cu`, `// train.cu
(nvcc: ...)`) becomes a .cu file (it computes on cuda), any other a .cpp file. A block
without `main(` has its lines wrapped in `int main() { ... }`, except #include lines and
top-level type definitions (from a line starting with struct, class, enum or template
to the next line starting with `};`), so statements shown at the top level (the
README's style) compile as a function body.
Prints one path per line (the list CMake builds); exits 1 when no block was found.
"""
import os
import re
import sys


def blocks(path):
    with open(path) as f:
        lines = f.read().splitlines()
    out, cur, indent = [], None, 0
    for line in lines:
        if cur is None and line.strip() in ("```cpp", "```c++", "```cxx", "```cu", "```cuda"):
            cur, indent = [], len(line) - len(line.lstrip())  # a fence inside a list is indented
        elif cur is not None and line.strip() == "```":
            out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def unit(block, origin):
    cuda = bool(block) and re.match(r"^//\s*\S+\.cu\b", block[0]) is not None
    text = "\n".join(block)
    if "main(" not in text:
        # #include lines and top-level type definitions (a line starting with struct,
        # class, enum or template, up to the next line starting with "};") stay outside.
        outside, body, in_type = [], [], False
        for l in block:
            if l.startswith("#include"):
                outside.append(l)
            elif in_type:
                outside.append(l)
                in_type = not l.startswith("}")
            elif re.match(r"^(struct|class|enum|template\s*<)", l):
                outside.append(l)
                in_type = not l.rstrip().endswith(("};", "}"))  # a whole definition on one line ends here
            else:
                body.append(l)
        text = "\n".join(outside + ["", "int main() {"] + ["  " + l if l else l for l in body] + ["}"])
    return cuda, f"// extracted from {origin} by tests/tools/extract_snippets.py\n{text}\n"


def main():
    out_dir, files = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        if old.endswith((".cpp", ".cu")):
            os.remove(os.path.join(out_dir, old))
    written = []
    for md in files:
        for i, b in enumerate(blocks(md), 1):
            cuda, text = unit(b, f"{os.path.basename(md)}, block {i}")
            name = os.path.join(out_dir, f"{os.path.splitext(os.path.basename(md))[0]}_{i}.{'cu' if cuda else 'cpp'}")
            with open(name, "w") as f:
                f.write(text)
            written.append(name)
    if not written:
        print("extract_snippets.py: no ```cpp block in " + " ".join(files), file=sys.stderr)
        return 1
    print("\n".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Lists the import cycles between the modules of the server crate (src/).

Every `crate::a::b` and `super::x` path of a file counts as an import of the
module file it names; tests modules count too. Prints each cycle (a strongly
connected set of more than one module) and exits 1 if there is one.

Usage: scripts/module-cycles.py [src directory]
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
root = os.path.normpath(root)

# Module path (tuple) of every file, and the file of every module path.
modules = {}
for directory, _, files in os.walk(root):
    for name in files:
        if not name.endswith(".rs") or directory.startswith(os.path.join(root, "bin")):
            continue
        relative = os.path.relpath(os.path.join(directory, name), root)[:-3].split(os.sep)
        if relative in (["lib"], ["main"]):
            path = ()
        elif relative[-1] == "mod":
            path = tuple(relative[:-1])
        else:
            path = tuple(relative)
        modules[path] = os.path.join(directory, name)


def module_of(path):
    """The longest prefix of `path` that is a module file."""
    for end in range(len(path), -1, -1):
        if tuple(path[:end]) in modules:
            return tuple(path[:end])
    return ()


reference = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
braces = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}")
edges = {path: set() for path in modules}
for path, file in modules.items():
    text = open(file, encoding="utf-8").read()
    # Comments are not imports.
    text = re.sub(r"//[^\n]*", "", text)
    found = []
    for head, prefix, inside in braces.findall(text):
        for item in inside.split(","):
            item = item.strip().split(" ")[0]
            if item:
                found.append((head, (prefix + "::" + item).split("::")[1:]))
    for head, rest in reference.findall(text):
        found.append((head, rest.split("::")[1:]))
    # A file `a/b.rs` is module a::b; its `super` is a (or the parent of a mod.rs's module).
    for head, parts in found:
        if head == "crate":
            target = module_of(parts)
        else:
            is_mod_file = file.endswith("mod.rs") or file.endswith("lib.rs")
            base = list(path) if is_mod_file else list(path[:-1])
            # `super::` inside an inline `mod tests` names this file's own module.
            target = module_of(base + parts)
            if target == () and not is_mod_file:
                target = module_of(list(path) + parts) if any(tuple(path) + tuple(parts[:1]) == m for m in modules) else ()
        if target != path and target != ():
            edges[path].add(target)

# Tarjan's strongly connected components.
index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]


def visit(node):
    index[node] = low[node] = counter[0]
    counter[0] += 1
    stack.append(node)
    on_stack.add(node)
    for target in edges[node]:
        if target not in index:
            visit(target)
            low[node] = min(low[node], low[target])
        elif target in on_stack:
            low[node] = min(low[node], index[target])
    if low[node] == index[node]:
        component = []
        while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
                break
        if len(component) > 1:
            cycles.append(component)


sys.setrecursionlimit(10000)
for node in sorted(modules):
    if node not in index:
        visit(node)

for component in cycles:
    print("cycle:", ", ".join("::".join(member) for member in sorted(component)))
print(f"{len(modules)} modules, {sum(len(targets) for targets in edges.values())} imports, {len(cycles)} cycles")
sys.exit(1 if cycles else 0)

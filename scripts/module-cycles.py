#!/usr/bin/env python3
"""Lists the import cycles between the modules of each crate of the workspace.

Every `crate::a::b` and `super::x` path of a file counts as an import of the
module file it names; tests modules count too. Prints each cycle (a strongly
connected set of more than one module) of each crate, and exits 1 if any
crate has one.

Usage: scripts/module-cycles.py [--workspace | SRC_DIRECTORY...]
  --workspace (the default): the `src` directory of every member of the
  workspace in Cargo.toml (the server, client, proto, shards, ring, bench,
  testkit). SRC_DIRECTORY: only these crates' source directories, such as
  `client/src`.
"""
import os
import re
import sys

REPOSITORY = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

reference = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
braces = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}")


def workspace_sources():
    """The `src` directory of every workspace member, in Cargo.toml's order."""
    text = open(os.path.join(REPOSITORY, "Cargo.toml"), encoding="utf-8").read()
    found = re.search(r"^\[workspace\][^\[]*?^members\s*=\s*\[([^\]]*)\]", text, re.MULTILINE | re.DOTALL)
    if not found:
        sys.exit("module-cycles.py: no [workspace] members in Cargo.toml")
    members = re.findall(r'"([^"]+)"', found.group(1))
    return [os.path.normpath(os.path.join(REPOSITORY, member, "src")) for member in members]


def module_files(root):
    """Module path (tuple) -> file, for the crate whose sources are in `root`.

    A library's root (`lib.rs`) is the module `()`; a binary's `main.rs` is
    too when there is no library. Beside a library, `main.rs` is a crate of
    its own that can only use the library by name, so it is left out, as
    are the other binaries under `bin/`.
    """
    has_library = os.path.exists(os.path.join(root, "lib.rs"))
    modules = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs") or directory.startswith(os.path.join(root, "bin")):
                continue
            relative = os.path.relpath(os.path.join(directory, name), root)[:-3].split(os.sep)
            if relative == ["main"] and has_library:
                continue
            if relative in (["lib"], ["main"]):
                path = ()
            elif relative[-1] == "mod":
                path = tuple(relative[:-1])
            else:
                path = tuple(relative)
            modules[path] = os.path.join(directory, name)
    return modules


def imports(modules):
    """Module path -> the set of module paths its file imports."""

    def module_of(path):
        """The longest prefix of `path` that is a module file."""
        for end in range(len(path), -1, -1):
            if tuple(path[:end]) in modules:
                return tuple(path[:end])
        return ()

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
    return edges


def cycles_of(edges):
    """The strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def main(arguments):
    if any(argument in ("-h", "--help") for argument in arguments):
        print(__doc__.strip())
        return 0
    unknown = [argument for argument in arguments if argument.startswith("-") and argument != "--workspace"]
    if unknown:
        print(f"module-cycles.py: unknown option {unknown[0]} (see --help)", file=sys.stderr)
        return 2
    roots = [os.path.normpath(argument) for argument in arguments if argument != "--workspace"]
    if not roots or "--workspace" in arguments:
        roots += workspace_sources()
    sys.setrecursionlimit(10000)
    total = 0
    for root in roots:
        if not os.path.isdir(root):
            print(f"module-cycles.py: {root} is not a directory", file=sys.stderr)
            return 2
        modules = module_files(root)
        edges = imports(modules)
        cycles = cycles_of(edges)
        total += len(cycles)
        inside = os.path.abspath(root).startswith(REPOSITORY + os.sep)
        name = os.path.relpath(os.path.abspath(root), REPOSITORY) if inside else root
        for component in cycles:
            print(f"{name}: cycle:", ", ".join("::".join(member) for member in sorted(component)))
        imported = sum(len(targets) for targets in edges.values())
        print(f"{name}: {len(modules)} modules, {imported} imports, {len(cycles)} cycles")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

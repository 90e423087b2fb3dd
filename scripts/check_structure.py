"""Structure checks of src/attnzoo: import cycles (explicit imports, function-level ones included; ``if
TYPE_CHECKING:`` blocks and the implicit import of parent packages are not counted) and functions over 80 lines.

Usage: ``python scripts/check_structure.py [SRC_ROOT]``; exits 1 when either is found (tests/test_repo_hygiene.py
runs it)."""

import ast
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
pkg = root / "attnzoo"
mods = {}
for p in pkg.rglob("*.py"):
    rel = p.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    mods[".".join(parts)] = p


def resolve(cur, is_pkg, node):
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            out.append(a.name)
    else:
        base = cur.split(".")
        if node.level:
            base = base if is_pkg else base[:-1]
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        for a in node.names:  # the submodule when the name is one, else the module named in the statement
            out.append(prefix + "." + a.name if prefix + "." + a.name in mods else prefix)
    return [m for m in out if m in mods]


class V(ast.NodeVisitor):
    def __init__(s, cur, is_pkg):
        s.cur, s.is_pkg, s.deps = cur, is_pkg, set()

    def visit_If(s, n):
        t = ast.unparse(n.test)
        if "TYPE_CHECKING" in t:
            for x in n.orelse:
                s.visit(x)
            return
        s.generic_visit(n)

    def visit_Import(s, n):
        s.deps.update(resolve(s.cur, s.is_pkg, n))

    def visit_ImportFrom(s, n):
        s.deps.update(resolve(s.cur, s.is_pkg, n))


graph = {}
long_funcs = []
for m, p in mods.items():
    tree = ast.parse(p.read_text())
    v = V(m, p.name == "__init__.py")
    v.visit(tree)
    # importing a.b.c also imports a.b and a (package __init__)
    deps = set(v.deps)  # explicit edges only: the implicit import of parent packages is not counted
    deps.discard(m)
    graph[m] = deps
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            L = n.end_lineno - n.lineno + 1
            if L > 80:
                long_funcs.append((L, f"{p}:{n.lineno} {n.name}"))
# strongly connected components (Tarjan)
idx, low, st, on, sccs, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)


def sc(v):
    idx[v] = low[v] = c[0]
    c[0] += 1
    st.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in idx:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in graph:
    if v not in idx:
        sc(v)
print(f"import cycles (strongly connected components): {len(sccs)}")
for comp in sccs:
    print("  ", len(comp), comp)
print(f"functions over 80 lines: {len(long_funcs)}")
for L, f in sorted(long_funcs, reverse=True):
    print("  ", L, f)
sys.exit(1 if sccs or long_funcs else 0)

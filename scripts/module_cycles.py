#!/usr/bin/env python3
"""Prints the library's module import cycles (strongly connected components
of the graph of `crate::` paths between its files), largest first.

Usage: scripts/module_cycles.py [CRATE_ROOT]   (default: the repository)
A file is a node; an edge a -> b means a names `crate::<path>` resolving
to b (the longest module path that is a file). `#[cfg(test)]` files and
`tests.rs` are skipped: tests may look anywhere.
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
src, ops = os.path.join(root, "src"), os.path.join(root, "ops")


def modules():
    """Module path (tuple) -> file, for src/ and ops/ (mounted at crate::ops)."""
    out = {}
    for base, prefix in ((src, ()), (ops, ("ops",))):
        if not os.path.isdir(base):
            continue
        for d, _, files in os.walk(base):
            for f in files:
                if not f.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(d, f), base)[:-3].split(os.sep)
                if rel[-1] in ("mod", "lib", "main"):
                    rel = rel[:-1]
                if rel and rel[-1] == "tests":
                    continue
                out[prefix + tuple(rel)] = os.path.join(d, f)
    return out


def edges(mods):
    use_re = re.compile(r"crate::([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)")
    brace_re = re.compile(r"use crate::((?:[a-z_][a-z0-9_]*::)*)\{([^;]*)\};", re.S)
    g = {m: set() for m in mods}
    for m, f in mods.items():
        text = open(f, encoding="utf-8").read()
        text = re.sub(r"//[^\n]*", "", text)
        paths = [p.split("::") for p in use_re.findall(text)]
        for pre, body in brace_re.findall(text):
            for item in re.split(r"[,\s]+", re.sub(r"\{[^}]*\}", "", body)):
                if item and item[0].islower():
                    paths.append(pre.split("::")[:-1] + item.split("::"))
        for p in paths:
            for n in range(len(p), 0, -1):
                t = tuple(p[:n])
                if t in mods:
                    if t != m and not (m[: len(t)] == t):
                        g[m].add(t)
                    break
    return g


def sccs(g):
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


mods = modules()
cycles = sorted(sccs(edges(mods)), key=len, reverse=True)
print(f"{len(mods)} modules, {len(cycles)} import cycles")
for c in cycles:
    print(f"{len(c)}: " + ", ".join(sorted("::".join(m) or "crate" for m in c)))

"""No two files of src/ call each other in a circle, nor two of its rooms.

Reads the library's object files (given as arguments, or one argument
holding CMake's ;-separated list), links each undefined symbol to the file
that defines it, and fails naming every strongly connected set of files with
the calls that close it; then the same over rooms (src/'s directories),
whose dependencies must read one way. The communicators' dispatch goes through a table
(src/comm/comm_impl.h), so it is no call here.
"""
import collections
import subprocess
import sys


def file_of(obj):
    name = obj.replace("\\", "/").split("/src/", 1)[-1]
    for tail in (".c.o", ".c.obj", ".o"):
        if name.endswith(tail):
            return name[: -len(tail)]
    return name


def main(args):
    objs = [o for a in args for o in a.split(";") if o]
    if not objs:
        sys.exit("circles.py: no object files given")
    defs, uses = {}, collections.defaultdict(set)
    for obj in objs:
        f = file_of(obj)
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBRCGSiVW":
                defs[p[2]] = f
            elif len(p) == 2 and p[0] == "U":
                uses[f].add(p[1])
    calls = collections.defaultdict(set)
    for f, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != f:
                calls[f].add(defs[s])
    files = set(defs.values()) | set(uses)
    rooms = collections.defaultdict(set)
    for f, to in calls.items():
        for g in to:
            if f.split("/")[0] != g.split("/")[0]:
                rooms[f.split("/")[0]].add(g.split("/")[0])
    bad = 0
    for what, graph, nodes in (("files", calls, files),
                               ("rooms", rooms, {f.split("/")[0] for f in files})):
        found = circles(graph, nodes)
        bad += len(found)
        for comp in found:
            print(f"{what} calling each other in a circle: " + ", ".join(comp))
            for a in comp:
                for b in sorted(graph[a] & set(comp)):
                    via = sorted(s for s in uses_between(uses, defs, a, b))
                    print(f"  {a} -> {b}: {', '.join(via[:4])}")
        print(f"{len(nodes)} {what}, {sum(len(v) for v in graph.values())} calls between "
              f"them, {len(found)} circles")
    return 1 if bad else 0


def uses_between(uses, defs, a, b):
    """The symbols file or room a takes from file or room b."""
    inside = lambda name, x: name == x or name.startswith(x + "/")
    return {s for f, syms in uses.items() if inside(f, a)
            for s in syms if s in defs and inside(defs[s], b)}


def circles(calls, nodes):
    """Strongly connected sets of more than one node."""
    # Tarjan's strongly connected components, iteratively
    index, low, on, stack, sccs, n = {}, {}, set(), [], [], 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(calls[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(calls[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    return sccs


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

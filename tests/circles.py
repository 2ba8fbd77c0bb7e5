"""No two files of src/ call each other in a circle.

Reads the library's object files (given as arguments, or one argument
holding CMake's ;-separated list), links each undefined symbol to the file
that defines it, and fails naming every strongly connected set of files with
the calls that close it. The communicators' dispatch goes through a table
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
            if len(p) == 3 and p[1] in "TDBRC":
                defs[p[2]] = f
            elif len(p) == 2 and p[0] == "U":
                uses[f].add(p[1])
    calls = collections.defaultdict(set)
    for f, syms in uses.items():
        for s in syms:
            if s in defs and defs[s] != f:
                calls[f].add(defs[s])
    # Tarjan's strongly connected components, iteratively
    index, low, on, stack, sccs, n = {}, {}, set(), [], [], 0
    for root in sorted(set(defs.values()) | set(uses)):
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
    for comp in sccs:
        print("files calling each other in a circle: " + ", ".join(comp))
        for a in comp:
            for b in sorted(calls[a] & set(comp)):
                via = sorted(s for s in uses[a] if defs.get(s) == b)
                print(f"  {a} -> {b}: {', '.join(via[:4])}")
    print(f"{len(set(defs.values()) | set(uses))} files, "
          f"{sum(len(v) for v in calls.values())} calls between them, {len(sccs)} circles")
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

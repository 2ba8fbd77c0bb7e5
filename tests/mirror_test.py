"""The Python package's ctypes mirrors of the library's structures, held to the headers.

python/repipe/_lib.py declares, as ctypes.Structure classes, the C structures it reads and
writes (rp_error, rp_workplan, ...). A field added, removed, reordered or retyped on one side
alone would have Python read the wrong bytes without a word; this test reads both sides as
text (the headers' typedefs, _lib.py's _fields_ by its syntax tree, no library loaded) and
fails naming the structure and the first field that differs. A mirror may hold the leading
fields of a structure only where _lib.py says so ("the leading fields of").

    python3 tests/mirror_test.py ROOT
"""
import ast
import os
import re
import sys

# each mirror and the structure it mirrors
MIRRORS = {
    "_Err": "rp_error", "_Shape": "rp_shape", "_Tensor": "rp_tensor", "_Weights": "rp_weights",
    "_Result": "rp_result", "_Model": "rp_model", "_Derived": "rp_derived",
    "_AutoplanOptions": "rp_autoplan_options", "_Grouping": "rp_grouping",
    "_Dataset": "rp_dataset", "_Stream": "rp_stream", "_Op": "rp_op",
    "_WorkerOps": "rp_worker_ops", "_Workplan": "rp_workplan",
}

# C types as a kind the ctypes type must be
C_KINDS = {
    "int": "int", "unsigned": "uint", "unsigned char": "uchar", "unsigned int": "uint", "double": "double",
    "long long": "longlong", "bool": "bool", "size_t": "size_t", "uint64_t": "uint64",
    "int32_t": "int32", "int64_t": "int64", "float": "float", "char": "char",
}
CTYPES_KINDS = {
    "c_int": "int", "_int": "int", "c_uint": "uint", "c_double": "double",
    "c_longlong": "longlong", "_ll": "longlong", "c_bool": "bool", "c_size_t": "size_t",
    "_size": "size_t", "c_uint64": "uint64", "c_int32": "int32", "c_int64": "int64",
    "c_float": "float", "c_char": "char",
}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def c_structs(root):
    """{name: [(field, kind)]} of every `typedef struct NAME {...} NAME;` of the headers;
    kind: 'ptr', 'array:<kind>', 'struct:<name>', 'enum', or a C_KINDS value."""
    out = {}
    inc = os.path.join(root, "include", "repipe")
    enums = set()
    for h in sorted(os.listdir(inc)):
        text = strip_comments(open(os.path.join(inc, h), encoding="utf-8").read())
        enums |= set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text))
        for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\1\s*;", text,
                                     re.S):
            fields = []
            for decl in body.split(";"):
                decl = " ".join(decl.split())
                if not decl:
                    continue
                if "(" in decl:  # a function pointer: (*name)(...)
                    fields.append((re.search(r"\(\s*\*\s*(\w+)\s*\)", decl).group(1), "ptr"))
                    continue
                decl = re.sub(r"^const\s+", "", decl)
                m = re.match(r"(unsigned int|unsigned char|unsigned long long|long long|unsigned|struct \w+|\w+)\b",
                             decl)
                base, rest = m.group(0), decl[m.end():]
                for d in rest.split(","):
                    d = d.strip()
                    fm = re.match(r"(\**)\s*(?:const\s+)?(\w+)\s*((?:\[[^\]]*\])*)", d)
                    stars, fname, dims = fm.groups()
                    kind = ("ptr" if stars else
                            C_KINDS.get(base, "enum" if base in enums else "struct:" + base))
                    fields.append((fname, "array:" + kind if dims else kind))
            out[name] = fields
    return out, enums


def kind_of(node):
    """The kind of a ctypes type expression of _lib.py, as c_structs writes C's."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return "array:" + kind_of(node.left)
    if isinstance(node, ast.Call):  # ctypes.POINTER(...)
        return "ptr"
    name = node.attr if isinstance(node, ast.Attribute) else node.id
    if name in ("c_void_p", "_P", "_F", "_I32", "_I64", "c_char_p", "_c"):
        return "ptr"
    if name in CTYPES_KINDS:
        return CTYPES_KINDS[name]
    return "struct:" + name


def mirrors(path):
    """{class: ([(field, kind)], leading_only)} of _lib.py's ctypes structures."""
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    out = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef) or node.name not in MIRRORS:
            continue
        leading = "the leading fields of" in lines[node.lineno - 1]
        for item in node.body:
            if isinstance(item, ast.Assign) and item.targets[0].id == "_fields_":
                out[node.name] = ([(e.elts[0].value, kind_of(e.elts[1]))
                                   for e in item.value.elts], leading)
    return out


def main(argv):
    root = argv[0] if argv else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    structs, enums = c_structs(root)
    py = mirrors(os.path.join(root, "python", "repipe", "_lib.py"))
    bad = []
    for cls, cname in MIRRORS.items():
        if cls not in py:
            bad.append(f"_lib.py has no class {cls} (the mirror of {cname})")
            continue
        if cname not in structs:
            bad.append(f"no header declares {cname}, which _lib.py's {cls} mirrors")
            continue
        fields, leading = py[cls]
        cfields = structs[cname]
        if not leading and len(fields) != len(cfields):
            bad.append(f"{cls} has {len(fields)} fields, {cname} {len(cfields)}")
        for i, ((pn, pk), c) in enumerate(zip(fields, cfields + [None] * len(fields))):
            if c is None:
                bad.append(f"{cls}.{pn}: {cname} has no field {i + 1}")
                break
            cn, ck = c
            ck = "int" if ck == "enum" else ck.replace("array:enum", "array:int")
            mirrored = {"struct:" + v: "struct:" + k for k, v in MIRRORS.items()}
            ck = mirrored.get(ck, ck)
            if pn != cn or pk != ck:
                bad.append(f"{cls} field {i + 1} is {pn} ({pk}); {cname}'s is {cn} ({ck})")
                break
    for b in bad:
        print(b)
    print(f"{len(MIRRORS)} mirrors held to the headers, {len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

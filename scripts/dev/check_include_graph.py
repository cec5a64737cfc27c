#!/usr/bin/env python3
"""The library's include graph keeps its layers (docs/design/layers.md): no include cycle, and no
include from a folder up to a higher layer or across to another folder of the same layer, no
MPI or Kokkos include in the layers of values below the runtime (PURE), no include of another
folder's detail/ (private to the folder that holds it), and no Kokkos launch, copy or fence outside
kernels/ (the one door for local work).

    python3 scripts/dev/check_include_graph.py [include/meshtensor]   # exit 1 and the edges when broken
    python3 scripts/dev/check_include_graph.py --self-test            # the check finds planted faults

Only the library's own quoted includes count (`#include "..."`, resolved against the including file).
A folder's layer is LAYERS' index; meshtensor.hpp, the umbrella, may include anything and nothing
includes it. ctest runs both (layers.include_graph, layers.include_graph.self_test).
"""
import os
import re
import sys
import tempfile

# Bottom first. A file may include files of its own folder and of lower layers only.
LAYERS = [
    ["error.hpp"],  # the exception types and the message builder
    ["names", "element", "geometry"],  # no MPI, no Kokkos: names, element types, the geometry of slices
    ["plan"],       # no MPI: collective kinds and counters, comm plans, the ledger, reports, the cost model
    ["layout"],     # no MPI: the mesh as a type (its axes), layouts, the candidate layouts
    ["runtime"],    # MPI: the running mesh, communicators, collectives, the environment, the watchdog
    ["kernels"],    # the one door for local work (Kokkos, BLAS, oneDNN, cuBLAS), the memory cache
    ["tensor"],     # the distributed tensor and its host I/O
    ["autodiff"],   # the tape and gradient()
    ["ops"],        # every op: forward, communication plan and gradient rule
    ["io", "nn", "optim", "pipeline", "fft"],  # checkpoints, layers, optimizers, pipeline stages, transforms
]
UMBRELLA = "meshtensor.hpp"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# Layers below the runtime are values: no MPI, no Kokkos (the geometry, the plan vocabulary and the
# layouts are unit-tested in one process, and plan mode sizes a run without either). element/ may use Kokkos's
# function qualifiers (bf16 arithmetic runs in device kernels), not MPI.
PURE = ["error.hpp", "names", "element", "geometry", "plan", "layout"]
KOKKOS_ALLOWED = ["element"]
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<((?:mpi|Kokkos)[^>]*)>', re.M)
# Local work enters through kernels/ (kernels/launch.hpp: parallel_for, parallel_reduce, deep_copy,
# host_mirror, copy_to, fence), which skips it while planning; elsewhere a Kokkos call that runs or
# moves data is refused. Types and policies (View, RangePolicy, TeamPolicy) may appear anywhere.
KERNELS = "kernels"
KOKKOS_CALL = re.compile(r'\bKokkos::(parallel_for|parallel_reduce|parallel_scan|deep_copy|create_mirror\w*|single|fence)\b'
                         r'|[.]fence\(\)')
COMMENT = re.compile(r'//[^\n]*')
# Policies are made on the library's execution space instance (kernels/instance.hpp: kernels::range,
# kernels::policy): a policy constructed elsewhere lands on the default instance, and on a GPU its
# kernel runs on another stream than the library's work, unordered with it.
POLICY_HOME = "kernels/instance.hpp"
POLICY_CONSTRUCTION = re.compile(r'\bKokkos::(?:Range|Team|MDRange)Policy<[^;]*?>\s*[({]')


def unit_of(path):
    """The folder a header belongs to (its first component), or the file itself at the top."""
    return path.split("/")[0]


def layer_of(unit):
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    return None


def headers(root):
    """Each header under root: its path relative to root (with /) and its text."""
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".hpp"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    yield os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"), f.read()


def read_graph(root):
    graph, calls = {}, {}
    for path, text in headers(root):
        graph[path] = [os.path.normpath(os.path.join(os.path.dirname(path), inc)).replace(os.sep, "/")
                       for inc in INCLUDE.findall(text)]
        code = COMMENT.sub("", text)
        found = {m.group(0) for m in KOKKOS_CALL.finditer(code)} if unit_of(path) != KERNELS else set()
        if path != POLICY_HOME:
            found |= {"a policy constructor, " + m.group(0).rstrip("({ ") for m in POLICY_CONSTRUCTION.finditer(code)}
        calls[path] = sorted(found)
        if unit_of(path) in PURE:
            graph[path] += [f"<{inc}>" for inc in SYSTEM_INCLUDE.findall(text)
                            if inc.startswith("mpi") or unit_of(path) not in KOKKOS_ALLOWED]
    return graph, calls


def private_owner(path):
    """The folder whose detail/ holds path ("ops" for ops/detail/x.hpp), or None."""
    parts = path.split("/")
    return "/".join(parts[:parts.index("detail")]) if "detail" in parts[:-1] else None


def cycles(graph):
    """Strongly connected components of more than one file (or a file including itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, []):
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def problems(graph, calls):
    out = []
    for path, found in sorted(calls.items()):
        for call in found:
            if call.startswith("a policy"):
                out.append(f"{path}: calls {call}, outside {POLICY_HOME} (make it with kernels::range or kernels::policy)")
            else:
                out.append(f"{path}: calls {call} outside {KERNELS}/ (enter through kernels/launch.hpp)")
    for path, includes in sorted(graph.items()):
        for inc in includes:
            if inc.startswith("<"):
                out.append(f"{path}: includes {inc}, but {unit_of(path)} holds values only (no MPI"
                           f"{'' if unit_of(path) in KOKKOS_ALLOWED else ', no Kokkos'})")
                continue
            if inc not in graph:
                out.append(f"{path}: includes {inc}, which is not a header of the library")
                continue
            if inc == UMBRELLA:
                out.append(f"{path}: includes the umbrella {UMBRELLA}")
                continue
            if path == UMBRELLA:
                continue
            owner = private_owner(inc)
            if owner is not None and not (path + "/").startswith(owner + "/"):
                out.append(f"{path}: includes {inc}, private to {owner}/ (its detail/)")
            src, dst = unit_of(path), unit_of(inc)
            if src == dst:
                continue
            ls, ld = layer_of(src), layer_of(dst)
            if ls is None or ld is None:
                out.append(f"{path} -> {inc}: '{src if ls is None else dst}' has no layer (add it to LAYERS)")
            elif ld > ls:
                out.append(f"{path} -> {inc}: upward, from {src} (layer {ls}) to {dst} (layer {ld})")
            elif ld == ls:
                out.append(f"{path} -> {inc}: across layer {ls}, from {src} to {dst}")
    for component in cycles(graph):
        out.append("include cycle: " + " -> ".join(component))
    return out


def self_test():
    """Plants each fault in a small tree and checks it is found, and that a clean tree passes."""
    def tree(files):
        root = tempfile.mkdtemp()
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return root

    clean = {"error.hpp": "", "runtime/a.hpp": '#include "../error.hpp"\n',
             "tensor/t.hpp": '#include "../runtime/a.hpp"\n', "meshtensor.hpp": '#include "tensor/t.hpp"\n'}
    cases = {
        "clean": (clean, None),
        "upward": ({**clean, "runtime/a.hpp": '#include "../tensor/t.hpp"\n'}, "upward, from runtime"),
        "across": ({**clean, "nn/n.hpp": '#include "../optim/o.hpp"\n', "optim/o.hpp": ""},
                   f"across layer {layer_of('nn')}"),
        "MPI below the runtime": ({**clean, "geometry/g.hpp": '#include <mpi.h>\n'}, "holds values only"),
        "Kokkos in the plan": ({**clean, "plan/p.hpp": '#include <Kokkos_Core.hpp>\n'}, "holds values only"),
        "MPI in element": ({**clean, "element/e.hpp": '#include <Kokkos_Core.hpp>\n#include <mpi.h>\n'},
                           "element/e.hpp: includes <mpi.h>"),
        "cycle": ({**clean, "tensor/u.hpp": '#include "t.hpp"\n',
                   "tensor/t.hpp": '#include "u.hpp"\n#include "../runtime/a.hpp"\n'}, "include cycle: tensor/t.hpp -> tensor/u.hpp"),
        "unknown folder": ({**clean, "extra/x.hpp": '#include "../error.hpp"\n'}, "'extra' has no layer"),
        "missing": ({**clean, "tensor/t.hpp": '#include "gone.hpp"\n'}, "not a header of the library"),
        "umbrella": ({**clean, "tensor/t.hpp": '#include "../meshtensor.hpp"\n'}, "includes the umbrella"),
        "another folder's detail": ({**clean, "ops/detail/d.hpp": "", "ops/o.hpp": '#include "detail/d.hpp"\n',
                                     "nn/n.hpp": '#include "../ops/detail/d.hpp"\n'}, "private to ops/"),
        "Kokkos launch outside kernels": ({**clean, "tensor/t.hpp": '#include "../runtime/a.hpp"\n'
                                          'void f() { Kokkos::parallel_for(1, g); }\n'}, "calls Kokkos::parallel_for outside"),
        "a fence outside kernels": ({**clean, "tensor/t.hpp": '#include "../runtime/a.hpp"\nvoid f() { E{}.fence(); }\n'},
                                    "calls .fence() outside"),
        "a policy off the library's instance": ({**clean, "kernels/k.hpp": 'auto p = Kokkos::RangePolicy<E>(0, n);\n'},
                                               "a policy constructor, Kokkos::RangePolicy<E>"),
        "a team policy off the library's instance": ({**clean, "ops/o.hpp": 'auto p = Kokkos::TeamPolicy<E>{n, Kokkos::AUTO};\n'},
                                                    "a policy constructor, Kokkos::TeamPolicy<E>"),
        "policy types, and a policy made on the instance": ({**clean, "ops/o.hpp": 'using p = Kokkos::MDRangePolicy<E, Kokkos::Rank<3>>;\n'
                                                            'Kokkos::RangePolicy<E> range(int b);\n'}, None),
        "a launch in kernels, a call in a comment": ({**clean, "kernels/k.hpp": 'void f() { Kokkos::deep_copy(a, b); }\n',
                                                     "tensor/t.hpp": '// not Kokkos::deep_copy(a, b) here\n'}, None),
        "a folder's own detail": ({**clean, "ops/detail/d.hpp": "", "ops/o.hpp": '#include "detail/d.hpp"\n'}, None),
    }
    failed = 0
    for name, (files, expected) in cases.items():
        found = problems(*read_graph(tree(files)))
        ok = not found if expected is None else any(expected in p for p in found)
        print(f"{name}: {'ok' if ok else 'NOT FOUND'}: {found}")
        failed += not ok
    return 1 if failed else 0


def main():
    if "--self-test" in sys.argv[1:]:
        return self_test()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "meshtensor")
    graph, calls = read_graph(root)
    found = problems(graph, calls)
    edges = sum(len(v) for v in graph.values())
    for p in found:
        print(p)
    print(f"{len(graph)} headers, {edges} includes: {'layers kept' if not found else f'{len(found)} problems'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

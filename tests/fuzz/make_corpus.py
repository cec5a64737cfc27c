#!/usr/bin/env python3
"""Writes the fuzzer's seed files (tests/fuzz/corpus/, each under 4 KB): small valid safetensors
files covering what the reader handles (every dtype size, a scalar, an empty tensor, 3 and 4 dims,
meshtensor's dim names, other metadata, a file with no tensors), and one file for each way the
reader rejects a file (bad-*), so that every rejection's message is checked from the first second
of a run, and mutations start next to each check. written_on_4.safetensors beside them is the
project's own writer's (checkpoint_tool at 4 ranks, copied from the test's build tree).
Run from anywhere: python3 tests/fuzz/make_corpus.py"""
import json, os, struct

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
size = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
        "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def write(name, tensors, meta=None, dims=None):
    header, data = {}, b""
    for t, (dtype, shape) in tensors.items():
        n = size[dtype]
        for e in shape:
            n *= e
        header[t] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += bytes((i * 37 + 11) % 256 for i in range(n))
    m = dict(meta or {})
    if dims is not None:
        m["meshtensor.dims"] = json.dumps(dims, separators=(",", ":"))
    if m:
        header["__metadata__"] = m
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    blob = struct.pack("<Q", len(text)) + text + data
    assert len(blob) < 4096, name
    with open(os.path.join(here, name), "wb") as f:
        f.write(blob)


write("two_2d.safetensors", {"a": ("F32", [5, 6]), "b": ("F64", [7])}, {"step": "3"}, {"a": ["i", "j"], "b": ["i"]})
write("scalar_and_empty.safetensors", {"s": ("I64", []), "z": ("I32", [0, 4]), "w": ("U8", [3, 0, 2])})
write("three_dims_bf16.safetensors", {"w": ("BF16", [3, 4, 5])}, None, {"w": ["heads", "d_kv", "d_model"]})
write("four_dims_small.safetensors", {"x": ("I8", [2, 3, 2, 3]), "m": ("BOOL", [4]), "h": ("F16", [3, 1])})
write("python_style.safetensors", {"weight": ("F32", [4, 4]), "bias": ("F32", [4])}, {"format": "pt"})
write("metadata_only.safetensors", {}, {"step": "0", "note": "no tensors"})
write("unsigned.safetensors", {"u": ("U64", [2]), "v": ("U32", [3]), "k": ("U16", [1, 2]), "f8": ("F8_E4M3", [5])})


def raw(name, header, data=b"", length=None):
    blob = struct.pack("<Q", len(header) if length is None else length) + header + data
    with open(os.path.join(here, name), "wb") as f:
        f.write(blob)


t = b'"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
d8 = bytes(8)
with open(os.path.join(here, "bad-short"), "wb") as f:
    f.write(b"\x10\x00\x00")
raw("bad-length-limit", b"{}", length=100_000_001)
raw("bad-length-past-end", b"{}", length=64)
raw("bad-not-json", b'{"t":{"dtype":"F32",')
raw("bad-not-object", b"[1,2]")
raw("bad-metadata-not-object", b'{"__metadata__":1}')
raw("bad-metadata-value", b'{"__metadata__":{"step":1}}')
raw("bad-entry-lacks", b'{"t":{"dtype":"F32","shape":[2]}}', d8)
raw("bad-dtype", b'{"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}', d8)
raw("bad-shape-not-array", b'{"t":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', d8)
raw("bad-shape-extent", b'{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', d8)
raw("bad-shape-too-large", b'{"t":{"dtype":"F64","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}}', d8)
raw("bad-offsets-not-two", b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}}', d8)
raw("bad-offsets-past-end", b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(4))
raw("bad-offsets-size", b'{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', d8)
raw("bad-dims-not-json", b'{' + t + b',"__metadata__":{"meshtensor.dims":"{\\"t\\":"}}', d8)
raw("bad-dims-not-object", b'{' + t + b',"__metadata__":{"meshtensor.dims":"[1]"}}', d8)
raw("bad-dims-rank", b'{' + t + b',"__metadata__":{"meshtensor.dims":"{\\"t\\":[\\"i\\",\\"j\\"]}"}}', d8)
raw("bad-dims-not-names", b'{' + t + b',"__metadata__":{"meshtensor.dims":"{\\"t\\":[3]}"}}', d8)
# Accepted (as meshtensor reads them; Python's safetensors rejects both): two tensors on the same
# bytes, and bytes no tensor holds.
raw("overlapping-offsets", b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                           b'"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', d8 + bytes(8))

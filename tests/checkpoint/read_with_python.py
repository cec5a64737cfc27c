"""Reads a checkpoint meshtensor wrote (on 4 ranks, checkpoint_tool write) with Python's
safetensors, as numpy arrays and as torch tensors, with no meshtensor code, and checks every value
against the formulas of checkpoint_tool.cpp, the dtypes, shapes and metadata."""
import json
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file as load_torch

path = sys.argv[1]
I, J = 13, 6
n = np.arange(I * J)
want = {
    "a": (0.25 * n - 3).astype(np.float32).reshape(I, J),
    "b": (0.5 * np.arange(I) + 1).astype(np.float64),
    "c": (3 * n - 7).astype(np.int32).reshape(I, J),
}

arrays = load_numpy(path)
assert sorted(arrays) == ["a", "b", "c"], sorted(arrays)
for name, w in want.items():
    got = arrays[name]
    assert got.dtype == w.dtype and got.shape == w.shape, (name, got.dtype, got.shape)
    assert np.array_equal(got, w), (name, got, w)

tensors = load_torch(path)
assert tensors["a"].dtype == torch.float32 and tensors["c"].dtype == torch.int32
assert torch.equal(tensors["b"], torch.from_numpy(want["b"]))

with safe_open(path, framework="numpy") as f:
    meta = f.metadata()
assert meta["written_by"] == "checkpoint_tool" and meta["ranks"] == "4", meta
assert json.loads(meta["meshtensor.dims"]) == {"a": ["i", "j"], "b": ["i"], "c": ["i", "j"]}, meta
print(f"python safetensors read {path}: a, b, c equal the formulas (numpy and torch), metadata {meta['ranks']} ranks")

"""emberps.dlrm: ps-worker's DLRM and Criteo features in PyTorch, with embeddings on EmberPS.

The model, its initialization and the features are the C worker's (docs/training.md), so a
PyTorch job and ps-worker train the same thing: 13 dense features log1p(max(x, 0)), one key per
categorical field (emberps.feature_key of the 8-hex-digit value; an empty value: missing_key),
bottom MLP 13-64-dim (ReLU after every layer), DLRM's dot interaction of the 27 vectors (the
strict lower triangle), top MLP (dim + 351)-128-64-1, Glorot-uniform weights and zero biases,
mean BCE on logits. Used by examples/torch_dlrm.py and `python3 -m emberps.bench`.
Imported on use (needs PyTorch).
"""
import re

import numpy as np
import torch
from torch import nn

from . import keys as _keys

DENSE, FIELDS = 13, 26


_INT = re.compile(r"[+-]?[0-9]{1,18}")  # pw_parse.c's scan_int: a sign, at most 18 digits
_HEX = re.compile(r"[0-9a-fA-F]{1,8}")


def read_criteo(path, rank=0, world=1, max_rows=0):
    """Criteo TSV -> labels (n,), dense (n, 13) float32, keys (n, 26) int64 (the keys' bits),
    rows rank, rank + world, ... of the file (at most max_rows of them when > 0)."""
    labels, dense, cats = [], [], [[] for _ in range(FIELDS)]
    with open(path) as f:
        for i, line in enumerate(f):
            if i % world != rank:
                continue
            if max_rows and len(labels) >= max_rows:
                break
            cols = line.rstrip("\r\n").split("\t")
            if len(cols) != 1 + DENSE + FIELDS:
                raise ValueError("%s:%d: %d columns, Criteo has 40" % (path, i + 1, len(cols)))
            # what ps-worker's parser takes (pw_parse.c), nothing more: a label 0 or 1, integer
            # counts, 1-8 hex digits a categorical; else the line's keys would differ
            bad = [] if _INT.fullmatch(cols[0]) and int(cols[0]) in (0, 1) else [cols[0]]
            bad += [c for c in cols[1:1 + DENSE] if c and not _INT.fullmatch(c)]
            bad += [c for c in cols[1 + DENSE:] if c and not _HEX.fullmatch(c)]
            if bad:
                raise ValueError("%s:%d: not a Criteo line (%r)" % (path, i + 1, bad[0]))
            labels.append(float(cols[0]))
            dense.append([float(x) if x else 0.0 for x in cols[1:1 + DENSE]])
            for j in range(FIELDS):
                cats[j].append(cols[1 + DENSE + j])
    n = len(labels)
    d = np.log1p(np.maximum(np.array(dense, dtype=np.float64).reshape(n, DENSE), 0))
    keys = np.empty((n, FIELDS), dtype=np.uint64)
    for j in range(FIELDS):
        vals = np.array([int(v, 16) if v else 0 for v in cats[j]], dtype=np.uint64)
        keys[:, j] = _keys.feature_key(j, vals)
        empty = np.array([not v for v in cats[j]], dtype=bool)
        keys[empty, j] = _keys.missing_key(j)
    return (np.array(labels, dtype=np.float32), d.astype(np.float32),
            keys.view(np.int64))


def mlp(widths, relu_last):
    layers = []
    for i in range(len(widths) - 1):
        lin = nn.Linear(widths[i], widths[i + 1])
        nn.init.xavier_uniform_(lin.weight)  # as ps-worker: Glorot uniform, zero bias
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if i + 2 < len(widths) or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """The dense part: bottom MLP, DLRM's dot interaction of the 27 vectors, top MLP. The bottom
    MLP ends at the embedding dim (default 13-64-dim, ps-worker's --bottom=64,DIM)."""

    def __init__(self, dim, bottom=None, top=(128, 64, 1)):
        super().__init__()
        bottom = (64, dim) if bottom is None else tuple(bottom)
        if not bottom or bottom[-1] != dim:
            raise ValueError("the bottom MLP %s must end at the embedding dim %d"
                             % (bottom, dim))
        self.bottom = mlp([DENSE, *bottom], True)
        f = FIELDS + 1
        self.top = mlp([dim + f * (f - 1) // 2, *top], False)
        li, lj = torch.tril_indices(f, f, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, emb):  # emb: batch x 26 x dim
        bot = self.bottom(dense)
        z = torch.cat([bot.unsqueeze(1), emb], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([bot, inter], dim=1)).squeeze(1)


def embed(emb, keys):
    """keys (batch, 26) -> (batch, 26, dim): every field its own bag of one key."""
    b = keys.shape[0]
    flat = keys.reshape(-1)
    return emb(flat, torch.arange(0, flat.numel(), dtype=torch.int64)).reshape(b, FIELDS, -1)


def auc(labels, scores):
    """Area under the ROC curve (Mann-Whitney, ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels > 0.5
    npos, nneg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))

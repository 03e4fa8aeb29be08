"""Host-side graph algorithms on an operator DAG given as an edge list (numpy, no JAX).

Nodes are `0..n-1`, edges `[E, 2] int` as (src, dst). Everything here has data-dependent
shapes and runs once per graph on the host; only the resulting fixed-width arrays are padded
and sent to the device.

Positional encodings are pluggable: `PE_FUNCTIONS[name](n, edges, dim) -> [n, dim] float32`.
"""

from __future__ import annotations

import heapq

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla


class CycleError(ValueError):
    """The graph has a cycle; `node` is one node on (or behind) it."""

    def __init__(self, node: int):
        super().__init__(f"cycle through node {node}")
        self.node = node


def _adjacency_lists(n: int, edges: np.ndarray) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges.tolist():
        succ[s].append(d)
    return succ


def topological_order(n: int, edges: np.ndarray) -> np.ndarray:
    """Kahn's algorithm; among ready nodes the lowest index goes first (stable, deterministic).

    Returns:
      `[n] int64` permutation. Raises `CycleError` if the graph is not a DAG.
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    succ = _adjacency_lists(n, edges)
    indeg = np.bincount(edges[:, 1], minlength=n).tolist() if len(edges) else [0] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, v)
    if len(order) != n:
        remaining = [i for i in range(n) if indeg[i] > 0]
        raise CycleError(remaining[0])
    return np.asarray(order, dtype=np.int64)


def depths(n: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Longest path from any source (`depth`) and to any sink (`reverse_depth`), `[n] int32`.

    Nodes must already be numbered in a topological order (src < dst for every edge).
    """
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if len(edges):
        assert (edges[:, 0] < edges[:, 1]).all(), "nodes are not in topological order"
    depth = np.zeros(n, np.int64)
    rdepth = np.zeros(n, np.int64)
    # Edges sorted by dst (resp. by src, descending) relax in one sweep each.
    for s, d in edges[np.argsort(edges[:, 1], kind="stable")].tolist():
        if depth[s] + 1 > depth[d]:
            depth[d] = depth[s] + 1
    for s, d in edges[np.argsort(-edges[:, 0], kind="stable")].tolist():
        if rdepth[d] + 1 > rdepth[s]:
            rdepth[s] = rdepth[d] + 1
    return depth.astype(np.int32), rdepth.astype(np.int32)


def _undirected(n: int, edges: np.ndarray) -> sp.csr_matrix:
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    rows = np.concatenate([edges[:, 0], edges[:, 1]])
    cols = np.concatenate([edges[:, 1], edges[:, 0]])
    a = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    a.data[:] = 1.0  # duplicate edges count once
    return a


def _fix_signs(vecs: np.ndarray) -> np.ndarray:
    """Sign convention: the largest-magnitude entry of each vector (first on ties) is positive."""
    if vecs.size == 0:
        return vecs
    idx = np.argmax(np.abs(vecs) > np.abs(vecs).max(axis=0) - 1e-9, axis=0)
    signs = np.sign(vecs[idx, np.arange(vecs.shape[1])])
    signs[signs == 0] = 1.0
    return vecs * signs


DENSE_LIMIT = 2048  # graphs up to this size use a dense eigendecomposition


def laplacian_pe(n: int, edges: np.ndarray, dim: int) -> np.ndarray:
    """Eigenvectors of the symmetric normalised Laplacian of the undirected graph.

    The `dim` eigenvectors after the trivial one, by ascending eigenvalue, with the sign
    convention of `_fix_signs` (vectors of repeated eigenvalues are still only defined up to a
    rotation). Zero-padded when the graph has fewer than `dim + 1` nodes. Returns `[n, dim]`.
    """
    out = np.zeros((n, dim), np.float32)
    k = min(dim, n - 1)
    if k <= 0:
        return out
    a = _undirected(n, edges)
    deg = np.asarray(a.sum(axis=1)).ravel()
    inv_sqrt = np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1e-12)), 0.0)
    d = sp.diags(inv_sqrt)
    lap = sp.identity(n) - d @ a @ d
    if n <= DENSE_LIMIT:
        _, vecs = np.linalg.eigh(lap.toarray())
        vecs = vecs[:, 1:k + 1]
    else:  # shift-invert around just below 0 finds the smallest eigenvalues quickly
        vals, vecs = spla.eigsh(lap.tocsc(), k=k + 1, sigma=-1e-3, which="LM",
                                v0=np.ones(n) / np.sqrt(n))
        vecs = vecs[:, np.argsort(vals)][:, 1:k + 1]
    out[:, :k] = _fix_signs(vecs)
    return out


def random_walk_pe(n: int, edges: np.ndarray, dim: int) -> np.ndarray:
    """Random-walk landing probabilities: `[n, dim]`, column t-1 is P^t[i, i] for t = 1..dim.

    P = D^-1 A on the undirected graph (isolated nodes stay put with probability 0).
    """
    out = np.zeros((n, dim), np.float32)
    if n == 0 or dim == 0:
        return out
    a = _undirected(n, edges)
    deg = np.asarray(a.sum(axis=1)).ravel()
    p = sp.diags(np.where(deg > 0, 1.0 / np.maximum(deg, 1e-12), 0.0)) @ a
    p = p.tocsr()
    m = p
    for t in range(dim):
        out[:, t] = m.diagonal()
        if t + 1 < dim:
            m = m @ p
            m.data[m.data < 1e-6] = 0.0  # prune vanishing mass to keep P^t sparse
            m.eliminate_zeros()
    return out


PE_FUNCTIONS = {"laplacian": laplacian_pe, "random_walk": random_walk_pe}

"""Topological order, depths and positional encodings on hand-built and random DAGs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converters.graph import CycleError, depths, laplacian_pe, random_walk_pe, topological_order

# 0 -> 1 -> 3 -> 4, 0 -> 2 -> 3, 2 -> 4  (a diamond with a skip edge)
DIAMOND = np.array([[0, 1], [0, 2], [1, 3], [2, 3], [3, 4], [2, 4]])


def test_depths_golden():
    depth, rdepth = depths(5, DIAMOND)
    assert depth.tolist() == [0, 1, 1, 2, 3]
    assert rdepth.tolist() == [3, 2, 2, 1, 0]


def test_topological_order_is_stable_lowest_index_first():
    # 3 and 1 are both ready after 0; the lower index goes first
    assert topological_order(4, np.array([[0, 3], [0, 1], [3, 2], [1, 2]])).tolist() == \
        [0, 1, 3, 2]


def test_cycle_is_reported():
    with pytest.raises(CycleError):
        topological_order(3, np.array([[0, 1], [1, 2], [2, 1]]))


@st.composite
def random_dags(draw):
    n = draw(st.integers(1, 40))
    perm = draw(st.permutations(range(n)))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=3 * n))
    edges = [(perm[min(a, b)], perm[max(a, b)]) for a, b in pairs if a != b]
    return n, np.array(edges, dtype=np.int64).reshape(-1, 2)


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_topological_order_invariants(dag):
    n, edges = dag
    order = topological_order(n, edges)
    assert sorted(order.tolist()) == list(range(n))  # a permutation
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    assert (pos[edges[:, 0]] < pos[edges[:, 1]]).all()  # every edge points forward
    assert (topological_order(n, edges) == order).all()  # deterministic
    # relabelled in that order, depth grows along every edge
    relabelled = pos[edges]
    depth, rdepth = depths(n, relabelled)
    assert (depth[relabelled[:, 1]] > depth[relabelled[:, 0]]).all()
    assert (rdepth[relabelled[:, 0]] > rdepth[relabelled[:, 1]]).all()


def test_laplacian_pe_golden_on_path():
    # path 0-1-2: normalised Laplacian eigenvalues 0, 1, 2; the eigenvector of 1 is
    # (1, 0, -1)/sqrt(2), sign fixed so the largest entry (first on ties) is positive
    pe = laplacian_pe(3, np.array([[0, 1], [1, 2]]), 2)
    np.testing.assert_allclose(pe[:, 0], [1 / np.sqrt(2), 0, -1 / np.sqrt(2)], atol=1e-6)
    # eigenvalue 2: (1, -sqrt(2), 1)/2, largest magnitude is the middle entry -> positive
    np.testing.assert_allclose(pe[:, 1], [-0.5, np.sqrt(2) / 2, -0.5], atol=1e-6)
    assert laplacian_pe(1, np.zeros((0, 2)), 4).shape == (1, 4)  # padded


def test_laplacian_pe_sparse_path_matches_dense(monkeypatch):
    import converters.graph as g
    rng = np.random.default_rng(0)
    n = 60
    edges = np.array([(i, i + 1) for i in range(n - 1)] +
                     [(i, j) for i, j in rng.integers(0, n, (20, 2)) if i < j])
    dense = laplacian_pe(n, edges, 3)
    monkeypatch.setattr(g, "DENSE_LIMIT", 10)
    sparse = laplacian_pe(n, edges, 3)
    np.testing.assert_allclose(np.abs(sparse), np.abs(dense), atol=1e-5)


def test_random_walk_pe_golden():
    # on the path 0-1-2, from the middle: P^2[1,1] = 1 (always back), from an end: 1/2
    pe = random_walk_pe(3, np.array([[0, 1], [1, 2]]), 3)
    np.testing.assert_allclose(pe[:, 0], [0, 0, 0])
    np.testing.assert_allclose(pe[:, 1], [0.5, 1.0, 0.5])
    np.testing.assert_allclose(pe[:, 2], [0, 0, 0])

"""Kernel cost modelling on the machine at hand: an operator row as a runnable operator,
the operator profiler, and the cost model of operator rows."""

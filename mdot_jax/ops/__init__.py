"""Operator-level measurement and cost: single operators timed on a device (`profile`), the
rows they come from (`specs`), and a cost model from row to milliseconds (`cost`)."""

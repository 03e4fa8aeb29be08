"""Evaluation: every method on identical folds (`evaluate`) and error bands for a checkpoint
from such a run (`calibrate`)."""

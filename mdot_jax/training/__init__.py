"""Training: the jitted train/predict steps and the crash-safe loop (`train`); one split of a
dataset trained, tested and saved as a checkpoint (`workflow`)."""

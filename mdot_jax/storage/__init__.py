"""What training writes and serving reads: self-describing checkpoints and their error bands."""

"""Data and measurement: datasets of measured samples (`dataset`), the features a network reads
(`features`), measuring training iterations on this machine (`profile`), and the RTX 3090
dataset from timm's published tables (`build_timm`)."""

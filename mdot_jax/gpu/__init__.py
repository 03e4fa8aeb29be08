"""GPU pricing: the catalog of spec sheets, the operator model and its fit on public
measurements, a step priced from a spec sheet, and data parallelism over N GPUs."""

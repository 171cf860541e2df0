"""One DLRM training step of a sharding plan as an op graph (modelled or as TorchRec issues it)."""

"""Package data of the simulator: the GPU catalog (``gpus.yaml``)."""

"""DMT for real: the SPTT exchange's semantics checked on gloo, and towers run under TorchRec."""

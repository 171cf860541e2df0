"""Built-in transformer model specs (YAML), loadable by name."""

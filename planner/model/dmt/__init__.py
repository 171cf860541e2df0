"""DMT towers: the tower module spec and tower layouts (which host serves which tables)."""

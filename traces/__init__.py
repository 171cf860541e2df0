"""Measured and published traces shipped as package data (efficiency tables, ...)."""

"""Built-in topology files (YAML); see README.md in this folder for the schema."""

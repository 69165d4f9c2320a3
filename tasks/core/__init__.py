"""What every stage shares: strict pydantic configs over YAML (`config`) and the data root, one
fsspec URL resolved once into a `Root` (`storage`). Imports no other stage."""

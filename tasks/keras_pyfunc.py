"""Loader path of models registered before the stage packages (MLmodel: `loader_module:
tasks.keras_pyfunc`). Those versions stay loadable: this forwards to the loader's new home,
tasks.registry.keras_pyfunc. New versions name the new path directly.

Why a module here and not inside the registry stage: `mlflow.pyfunc.load_model` imports the
MLmodel's `loader_module` by name (`importlib.import_module`) and has no alias for a moved
loader, and the MLmodel file is an immutable artifact of each registered version. So this import
path must keep existing as long as such versions are kept; nothing else belongs here. Held by
tests/tasks/registry/test_register.py (a champion loads under both loader paths)."""

from tasks.registry.keras_pyfunc import _load_pyfunc  # noqa: F401

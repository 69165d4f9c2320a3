"""Loader path of models registered before the stage packages (MLmodel: `loader_module:
tasks.keras_pyfunc`). Those versions stay loadable: this forwards to the loader's new home,
tasks.registry.keras_pyfunc. New versions name the new path directly."""

from tasks.registry.keras_pyfunc import _load_pyfunc  # noqa: F401

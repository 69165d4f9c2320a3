"""Lets any fresh Python load heapcast's Keras models: `mlflow.keras.load_model(...)` or
`keras.saving.load_model(...)`, with nothing of heapcast imported first.

Keras rebuilds a custom layer (NGramFeatures, OnlineOrders) only from its registry of custom
objects, and never imports a module named in a model file. The one line in heapcast-keras.pth
(written into site-packages by scripts/setup.sh) calls `install()` at start-up: an import hook
that, once Keras' registry module is loaded, swaps its dict for one that imports
tasks.learning.nextcall.model the first time a name under heapcast's package ("heapcast>...") is looked
up. Stdlib only; only heapcast's own module is ever imported, by its fixed name; it steps aside
on anything unexpected. Why and how: docs/results.md#loading-a-model-in-a-fresh-python.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys

REGISTRY_MODULE = "keras.src.saving.object_registration"
PACKAGE_PREFIX = "heapcast>"  # register_keras_serializable(package="heapcast") names
LAYERS_MODULE = "tasks.learning.nextcall.model"


class LazyRegistry(dict):
    """Keras' GLOBAL_CUSTOM_OBJECTS, which imports heapcast's layers on the first look-up of one
    of their names. Keras reads it with `in`, `[]`, `get` and `{**registry}`."""

    tried = False

    def _fill(self, key) -> None:
        if (
            not LazyRegistry.tried
            and isinstance(key, str)
            and key.startswith(PACKAGE_PREFIX)
            and not dict.__contains__(self, key)
        ):
            LazyRegistry.tried = True  # once: a failed import is not retried per look-up
            try:
                importlib.import_module(LAYERS_MODULE)
            except Exception:  # step aside: Keras names what it cannot find
                pass

    def __contains__(self, key) -> bool:
        self._fill(key)
        return dict.__contains__(self, key)

    def __getitem__(self, key):
        self._fill(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._fill(key)
        return dict.get(self, key, default)


class _RegistryHook(importlib.abc.MetaPathFinder):
    """Finds Keras' registry module the normal way and swaps its dict right after it runs, before
    any other module can take a reference to it."""

    def find_spec(self, name, path, target=None):
        if name != REGISTRY_MODULE:
            return None
        # one-shot: off the path of every later import
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # not a plain source module: leave Keras as it is
        run = loader.exec_module

        def exec_module(module):
            run(module)
            registry = getattr(module, "GLOBAL_CUSTOM_OBJECTS", None)
            if type(registry) is dict:
                module.GLOBAL_CUSTOM_OBJECTS = LazyRegistry(registry)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Adds the hook once; does nothing when Keras' registry is already loaded (swap it now)."""
    loaded = sys.modules.get(REGISTRY_MODULE)
    if loaded is not None:
        registry = getattr(loaded, "GLOBAL_CUSTOM_OBJECTS", None)
        if type(registry) is dict:
            loaded.GLOBAL_CUSTOM_OBJECTS = LazyRegistry(registry)
        return
    if not any(isinstance(finder, _RegistryHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegistryHook())

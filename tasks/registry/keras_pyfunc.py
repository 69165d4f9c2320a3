"""The pyfunc loader of heapcast's registered Keras models.

The hybrid model carries the back-off n-gram table in a custom layer (tasks.learning.nextcall.model.NGramFeatures).
Keras rebuilds a custom layer only when the module that registers it was imported, and MLflow's
own Keras pyfunc loader imports nothing of ours: `mlflow.pyfunc.load_model("models:/...")` in a
fresh process would fail with "Could not locate class 'NGramFeatures'". tasks/registry/register.py points
the model's python_function flavour here, so the layers are registered first and MLflow's loader
does the rest, with Keras's per-call progress bar off.
"""

from __future__ import annotations

import functools

# Imported only by MLflow when it loads a model, which needs keras and mlflow anyway.
from mlflow.keras.load import KerasModelWrapper
from mlflow.keras.load import _load_pyfunc as load_keras_pyfunc

import tasks.learning.nextcall.model  # noqa: F401  (registers heapcast's custom Keras layers)


class QuietKerasModel(KerasModelWrapper):
    """MLflow's Keras pyfunc model, predicting with verbose=0: Keras's own default prints a
    progress bar (`1/1 ━━━━ 0s 617ms/step`) on every call, into the caller's output."""

    def get_model_call_method(self):
        if self.save_exported_model:
            return self.model.serve
        return functools.partial(self.model.predict, verbose=0)


def _load_pyfunc(path: str) -> QuietKerasModel:
    loaded = load_keras_pyfunc(path)
    return QuietKerasModel(loaded.model, loaded.signature, loaded.save_exported_model)

"""The pyfunc loader of heapcast's registered Keras models.

The hybrid model carries the back-off n-gram table in a custom layer (tasks.learning.model.NGramFeatures).
Keras rebuilds a custom layer only when the module that registers it was imported, and MLflow's
own Keras pyfunc loader imports nothing of ours: `mlflow.pyfunc.load_model("models:/...")` in a
fresh process would fail with "Could not locate class 'NGramFeatures'". tasks/registry/register.py points
the model's python_function flavour here, so the layers are registered first and MLflow's loader
does the rest.
"""

from __future__ import annotations

import tasks.learning.model  # noqa: F401  (registers heapcast's custom Keras layers)


def _load_pyfunc(path: str):
    from mlflow.keras.load import _load_pyfunc as load_keras_pyfunc

    return load_keras_pyfunc(path)

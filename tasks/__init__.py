"""heapcast's stages, one package each, in pipeline order:

  core      what every stage shares: strict YAML configs, the data root (`Root`)
  format    the tracer's raw format: its one reader, and building the tracer
  replay    the workload catalog, inputs, images, runners: raw traces + manifests
  dataset   raw traces -> the Parquet events dataset (Dask), the token rule
  learning  token sequences -> predictor, baselines, evaluation on unseen runs/programs
  registry  MLflow: params, metrics, plots, model versions, the `champion` alias
  nightly   the night's parameters and its summary

Imports run one way, down this list: a stage imports only the stages above it.
"""

from tasks.core.config import apply_embedded_defaults
from tasks.learning.nextcall.backend import check_before_keras

apply_embedded_defaults()
check_before_keras()  # KERAS_BACKEND checked at the first `import keras`, with what to install

"""BHive-format datasets: loading, splitting, metrics and the small shipped sets.

Impure code at the edge of diffsim: files in, numpy arrays out. Throughputs stay in
BHive's unit here (cycles per 100 iterations); the simulator's unit is cycles per
iteration, and callers convert when they cross into it.
"""

from diffsim.data import metrics as metrics
from diffsim.data.bhive import Dataset as Dataset
from diffsim.data.bhive import Row as Row
from diffsim.data.bhive import load_csv as load_csv
from diffsim.data.bhive import load_rows as load_rows
from diffsim.data.metrics import kendall_tau as kendall_tau
from diffsim.data.metrics import mape as mape
from diffsim.data.metrics import summary as summary
from diffsim.data.metrics import within as within
from diffsim.data.shipped import SHIPPED as SHIPPED
from diffsim.data.shipped import corpus_hexes as corpus_hexes
from diffsim.data.shipped import shared_data_dir as shared_data_dir
from diffsim.data.shipped import shipped as shipped
from diffsim.data.split import split as split
from diffsim.data.split import split_ids as split_ids
from diffsim.data.weights import confidence_weights as confidence_weights

__all__ = [
  "SHIPPED",
  "Dataset",
  "Row",
  "confidence_weights",
  "corpus_hexes",
  "kendall_tau",
  "load_csv",
  "load_rows",
  "mape",
  "metrics",
  "shared_data_dir",
  "shipped",
  "split",
  "split_ids",
  "summary",
  "within",
]

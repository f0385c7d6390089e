"""sparsec: a sparse tensor compiler for deep learning on Apache TVM."""

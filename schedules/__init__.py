"""Composable schedule transformations and the default templates per target."""
from .cpu import default_cpu, finalize_cpu, hoist_reduction_init, parallel_rows
from .cuda_sddmm import lane_groups
from .cuda import (default_cuda, finalize_cuda, features_over_threads, row_reduce_over_lanes, rows_over_threads,
                   template_for)
from .knobs import Knob, Transformation, transformation
from .plan import Use, templates

__all__ = ["Knob", "Transformation", "transformation", "default_cpu", "finalize_cpu", "default_cuda", "finalize_cuda",
           "parallel_rows", "hoist_reduction_init", "features_over_threads", "lane_groups", "row_reduce_over_lanes",
           "rows_over_threads", "template_for", "templates", "Use"]

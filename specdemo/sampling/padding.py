"""The sizes the driver pads a target call to: a network sets its kernels up once per input shape, so a run's
calls share a few shapes (the time planner prices the padded size: planning/cost_model.py)."""

from __future__ import annotations

from bisect import bisect_left

# A target call of up to PADDED_ROWS rows is padded to the next of these sizes: a network sets up its
# kernels once per input shape (oneDNN convolutions on a CPU: a first call of a new shape took twice
# as long on the digits UNet; captured graphs on a GPU), so a run's calls share a few shapes. Four
# sizes an octave: a call pays at most a quarter more rows, and the time planner prices the padded size.
CALL_SIZES = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    10,
    12,
    14,
    16,
    20,
    24,
    28,
    32,
    40,
    48,
    56,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    224,
    256,
)
PADDED_ROWS = CALL_SIZES[-1]


def call_size(rows: int) -> int:
    """The rows a call of `rows` rows is padded to."""
    return CALL_SIZES[bisect_left(CALL_SIZES, rows)] if rows <= PADDED_ROWS else rows

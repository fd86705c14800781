"""The float32 gather_mm the Go side runs on MLX's CPU backend, for the reference scripts.

MLX's CPU gather_mm takes only float32, so there the MoE experts' products of bfloat16 or
float16 inputs run on float32 casts, rounded back to the input type: the cast the moe
package makes (exact for half inputs; float32 ones pass through as they are).
"""
import mlx.core as mx


def float32_gather_mm(orig):
    """gather_mm over orig (MLX's own) on float32 casts, rounded back to a's type."""

    def gather_mm(a, b, lhs_indices=None, rhs_indices=None, sorted_indices=False):
        y = orig(a.astype(mx.float32), b.astype(mx.float32), lhs_indices=lhs_indices,
                 rhs_indices=rhs_indices, sorted_indices=sorted_indices)
        return y.astype(a.dtype)

    return gather_mm


def patch_on_cpu():
    """Installs the float32 gather_mm when the default device is the CPU."""
    if not mx.default_device() == mx.gpu:
        mx.gather_mm = float32_gather_mm(mx.gather_mm)

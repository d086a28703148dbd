"""Weights on the wire (``methods/wire.py``)."""

import torch

from fltune.methods.wire import to_numpy


def test_to_numpy_copies_each_tensor_bit_for_bit_into_an_array_of_its_own():
    """One copy per dtype to the host, then each tensor's part as an array that owns its bytes: dtype, shape,
    bits and order as ``tensor.cpu().numpy()`` gives them, a transposed (non-contiguous) view and a scalar
    included; ``keys`` picks a sub-state."""
    torch.manual_seed(0)
    state = {"w": torch.randn(3, 4, requires_grad=True), "steps": torch.arange(5), "t": torch.randn(2, 3).t(),
             "s": torch.tensor(2.5), "h": torch.randn(3, dtype=torch.float64)}
    for keys in (None, {"steps", "t"}):
        arrays = to_numpy(state, keys)
        assert list(arrays) == [k for k in state if keys is None or k in keys]
        for name, array in arrays.items():
            want = state[name].detach().numpy()
            assert (array.dtype, array.shape, array.tobytes()) == (want.dtype, want.shape, want.tobytes()), name
            assert array.flags.owndata and array.flags.writeable, name

"""Every random number in a run flows from (seed, round, client id): numpy's SeedSequence (not seed + round
arithmetic) gives independent streams, so results depend neither on which or how many workers train, nor on client
order. On CUDA the kernels must be deterministic too (:func:`use_deterministic_cuda`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fltune.config import FederationConfig

CLIENT_STREAM, SAMPLING_STREAM = 1, 2
"""Stream tags: client/server training streams and client sampling never share a seed."""


def derive_seed(seed: int, round_: int, client: int) -> int:
    """A 63-bit seed for (seed, round, client); ``round = -1, client = -1`` is the initial model's stream."""
    entropy = [seed, CLIENT_STREAM, round_ + 1, client + 1]
    words = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return int((int(words[0]) << 31) ^ int(words[1])) & (2**63 - 1)


def round_clients(fed: FederationConfig, round_: int) -> list[int]:
    """The clients of round ``round_`` as ``federation.sampling`` draws them, from an RNG of (seed, round) alone
    (docs/methods.md §0), so every method and every worker count sees the same client sequence: ``fixed``, without
    replacement; ``bernoulli``, each taking part with ``fraction``: FedDyn's code's protocol (and FedDC's, MAN's:
    ``act_list <= act_prob``), a round that drew nobody drawing again, as there."""
    rng = np.random.default_rng(np.random.SeedSequence([fed.seed, SAMPLING_STREAM, round_]))
    if fed.sampling != "bernoulli":
        return sorted(int(c) for c in rng.choice(fed.clients, size=fed.clients_per_round, replace=False))
    while True:
        picked = np.flatnonzero(rng.uniform(size=fed.clients) <= fed.fraction)
        if picked.size:
            return [int(c) for c in picked]


CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's fixed-size workspace, which makes its GEMMs reproducible (read once, at the first cuBLAS call)."""


def use_deterministic_cuda(deterministic: bool) -> None:
    """Pick reproducible CUDA kernels, or the fastest ones (``resources.deterministic``): cuDNN's fastest
    convolution backward passes and cuBLAS's split-K GEMMs add partial sums in thread order, so a seed's weights
    would differ between runs. ``warn_only``: an op with no deterministic kernel warns instead of stopping. CUDA
    processes only: fltune's CPU kernels are deterministic already, and the flag would fill new tensors with NaN."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)

"""Seeded splits of a label array over clients (docs/methods.md §0, "Partitions").

Pure functions, all randomness from one ``numpy.random.default_rng(seed)``, so a partition can be cached on disk
(``federated.py``). ``classes`` and ``dirichlet_prior`` give every client ``len(labels) // num_clients`` samples and
drop the remainder; the others place every sample.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from fltune.errors import FLTuneError

DIRICHLET_MAX_DRAWS = 1000  # `dirichlet` redraws before giving up on partition.min_size


def partition(
    labels: np.ndarray, num_classes: int, kind: str, num_clients: int, seed: int, *,
    alpha: float = 0.5, classes_per_client: int | None = None, shards_per_client: int = 2,
    min_size: int = 10,
) -> list[np.ndarray]:
    """One sorted index array per client. Raises :class:`FLTuneError` naming the config field when these labels admit
    no such partition (what a field allows alone, the config checks)."""
    labels = _check_labels(labels, num_classes)
    if not 1 <= num_clients <= len(labels):
        raise FLTuneError(f"federation.clients: must be between 1 and the {len(labels)} samples to split; "
                          f"got {num_clients}")
    rng = np.random.default_rng(seed)
    parts = {
        "iid": lambda: np.array_split(rng.permutation(len(labels)), num_clients),
        "classes": lambda: _classes(labels, num_classes, num_clients, classes_per_client, rng),
        "dirichlet_prior": lambda: _dirichlet_prior(labels, num_classes, num_clients, alpha, rng),
        "dirichlet": lambda: _dirichlet(labels, num_classes, num_clients, alpha, min_size, rng),
        "shards": lambda: _shards(labels, num_clients, shards_per_client, rng),
        "class_shards": lambda: _class_shards(labels, num_classes, num_clients, shards_per_client, rng),
    }[kind]()
    return [np.sort(part).astype(np.int64) for part in parts]


def split_train_eval(
    indices: list[np.ndarray], eval_fraction: float, seed: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per client, a seeded shuffle: the first ``round((1 - f)·n)`` train, the rest eval (SimFAFL 70/30)."""
    rng = np.random.default_rng(seed)
    train, held_out = [], []
    for part in indices:
        shuffled = rng.permutation(part)
        n_train = round((1 - eval_fraction) * len(part))
        train.append(np.sort(shuffled[:n_train]).astype(np.int64))
        held_out.append(np.sort(shuffled[n_train:]).astype(np.int64))
    return train, held_out


def aligned_test_split(
    client_labels: list[np.ndarray], test_labels: np.ndarray, num_classes: int, per_client: int, seed: int,
) -> list[np.ndarray]:
    """Per client, test samples in the proportions of its own labels: FedSOL's per-client ``test_align`` split
    (``Lee-Gihun/FedSOL:train_tools/preprocessing/partition_strategy.py test_data_partitioning``). For each class
    of share p_c, int(``per_client``·p_c) samples (float32, as the code's tensors), drawn per client, so splits
    may overlap as in the code. Indices into ``test_labels``, sorted within each class."""
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
    out = []
    for labels in client_labels:
        shares = np.bincount(labels, minlength=num_classes).astype(np.float32) / np.float32(len(labels))
        picked = [np.sort(rng.choice(pool, min(len(pool), int(np.float32(per_client) * share)), replace=False))
                  for pool, share in zip(by_class, shares, strict=True)]
        out.append(np.concatenate(picked).astype(np.int64))
    return out


def check_held_out(field: str, fraction: float, held_out: list[np.ndarray], sizes: list[int],
                   each_client: str | None = None) -> None:
    """Refuse a ``fraction`` > 0 that :func:`split_train_eval` turned into no sample at all, or (when
    ``each_client`` names what scores every client on its own split) none for some client. Above 0.5/n a
    client of n samples holds out one: round((1 − f)·n) ≤ n − 1 once (1 − f)·n < n − 0.5."""
    if fraction == 0:
        return
    empty = [n for idx, n in zip(held_out, sizes, strict=True) if len(idx) == 0]
    if len(empty) == len(sizes):
        n, smallest = max(sizes), min(sizes)
        every = f"; above 0.5/{smallest} = {0.5 / smallest:.3g} for one of every client" if smallest < n else ""
        raise FLTuneError(f"{field}: {fraction:g} holds out no sample of any client (the largest has {n}); "
                          f"allowed: 0, or above 0.5/{n} = {0.5 / n:.3g}{every}")
    if empty and each_client:
        n = min(empty)
        raise FLTuneError(f"{field}: {fraction:g} holds out no sample of {len(empty)} of {len(sizes)} clients, "
                          f"and {each_client}; allowed: above 0.5/{n} = {0.5 / n:.3g} (the smallest client has "
                          f"{n} samples)")


# --- validation ---------------------------------------------------------------------------------------


def _check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Labels must be a 1-D integer array in [0, num_classes) (a programming error otherwise)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array; got {labels.dtype} {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}); got [{labels.min()}, {labels.max()}]")
    return labels.astype(np.int64, copy=False)


# --- classes (SimFAFL/FedCR non-IID1) -------------------------------------------------------------------


def _classes(labels: np.ndarray, num_classes: int, num_clients: int, k: int | None,
             rng: np.random.Generator) -> list[np.ndarray]:
    """Client j owns classes {(j+t) mod C : t<k} and gets ``len(labels) // N`` samples of them:
    ``haozzh/FedCR:utils/utils_dataset.py`` rule ``noniid`` (one sample at a time, stealing when a client's classes run
    dry), in bulk: :func:`_balanced_plan`, rounded down; :func:`_fill_levels` for the remainder (counts then differ
    by ≤ 1 given enough data); :func:`_reroute` for FedCR's stealing as augmenting paths. Where no assignment fills a
    client (e.g. k = 1 and a small class, or N < C), it stays smaller rather than receive a class it does not own."""
    if k is None or not 1 <= k <= num_classes:
        raise FLTuneError(f"partition.classes_per_client: must be in 1..{num_classes} for partition 'classes'; got {k}")
    owned = (np.arange(num_clients)[:, None] + np.arange(k)[None, :]) % num_classes
    supply = np.bincount(labels, minlength=num_classes)
    per_client = len(labels) // num_clients
    counts = np.floor(_balanced_plan(owned, supply, per_client)).astype(np.int64)
    left = supply - np.bincount(owned.ravel(), weights=counts.ravel(), minlength=num_classes).astype(np.int64)
    need = per_client - counts.sum(axis=1)
    _fill_levels(owned, counts, left, need, rng)
    _reroute(owned, counts, left, need)
    per_class = np.zeros((num_clients, num_classes), dtype=np.int64)
    np.put_along_axis(per_class, owned, counts, axis=1)
    return _deal(labels, per_class, rng)


def _balanced_plan(owned: np.ndarray, supply: np.ndarray, per_client: int,
                   max_iterations: int = 5000) -> np.ndarray:
    """Fractional [clients, k] counts: rows sum to ``per_client``, class totals stay ≤ ``supply``. The
    maximum-entropy plan by Bregman's balancing (Sinkhorn scaling): plan[j, t] = r_j · s_{owned[j, t]}, s ≤ 1
    shrinking only over-drawn classes. Stops at 0.1 sample over-drawn; if infeasible, the last plan is scaled
    down to the supply (some rows short)."""
    scale = np.ones(len(supply))
    for _ in range(max_iterations):
        weights = scale[owned]
        totals = weights.sum(axis=1, keepdims=True)
        plan = np.divide(per_client * weights, totals, out=np.zeros_like(weights), where=totals > 0)
        drawn = np.bincount(owned.ravel(), weights=plan.ravel(), minlength=len(supply))
        ratio = np.divide(supply, drawn, out=np.ones_like(drawn), where=drawn > 0)
        if (drawn <= supply + 0.1).all():
            break
        scale = np.minimum(1.0, scale * ratio)
    return plan * np.minimum(1.0, ratio)[owned]


def _fill_levels(owned: np.ndarray, counts: np.ndarray, left: np.ndarray, need: np.ndarray,
                 rng: np.random.Generator) -> None:
    """Raise every client with room by one sample of each owned class with data left, per level, in place;
    (j+t) order breaks ties (FedCR's), a scarce class c serves ``left[c]`` of its requests, chosen at random."""
    while True:
        wants = (left[owned] > 0) & (need[:, None] > 0)
        if not wants.any():
            return
        slots = np.flatnonzero(wants & (np.cumsum(wants, axis=1) <= need[:, None]))
        cls = owned.ravel()[slots]
        granted = np.zeros(owned.shape, dtype=np.int64)
        granted.flat[slots] = _rank_in_group(cls, np.lexsort((rng.random(len(slots)), cls))) < left[cls]
        counts += granted
        need -= granted.sum(axis=1)
        left -= np.bincount(owned.ravel(), weights=granted.ravel(), minlength=len(left)).astype(np.int64)


def _rank_in_group(groups: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each entry's place among the entries of its group, counted in ``order`` (which sorts ``groups``)."""
    rank = np.empty(len(groups), dtype=np.int64)
    rank[order] = np.arange(len(groups)) - np.searchsorted(groups[order], groups[order])
    return rank


def _reroute(owned: np.ndarray, counts: np.ndarray, left: np.ndarray, need: np.ndarray) -> None:
    """Fill clients whose owned classes ran dry through chains of clients sharing a class, in place. Chain
    j --c1--> i1 --c2--> ... --cm--> (spare cm), found breadth-first, moves its narrowest link's amount. A
    client with no chain never gains one later (max-flow), so it is left short."""
    num_classes = len(left)
    for start in np.flatnonzero(need > 0):
        while need[start] > 0:
            chain = _find_chain(start, owned, counts, left, num_classes)
            if chain is None:
                break
            # (giver, giver's slot) for each link: the next client in the chain gives the taker's class
            givers = [(giver, int((owned[taker, slot] - giver) % num_classes))
                      for (taker, slot), (giver, _) in zip(chain, chain[1:])]
            amount = min(need[start], left[owned[chain[-1]]], *(counts[link] for link in givers))
            for client, slot in chain:
                counts[client, slot] += amount
            for giver, slot in givers:
                counts[giver, slot] -= amount
            left[owned[chain[-1]]] -= amount
            need[start] -= amount


def _find_chain(start: int, owned: np.ndarray, counts: np.ndarray, left: np.ndarray,
                num_classes: int) -> list[tuple[int, int]] | None:
    """Shortest chain of (taker, owned slot) from ``start`` to a class with spare data, or None."""
    num_clients, k = owned.shape
    parent: dict[int, tuple[int, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        taker = queue.popleft()
        for slot in range(k):
            cls = owned[taker, slot]
            if left[cls] > 0:  # unwind the search: [(start, slot), ..., (taker, slot)]
                chain = [(taker, slot)]
                while parent[chain[0][0]] is not None:
                    chain.insert(0, parent[chain[0][0]])
                return chain
            for holder_slot in range(k):  # owners of cls are the clients j ≡ cls - t (mod C), t < k
                for holder in range((cls - holder_slot) % num_classes, num_clients, num_classes):
                    if holder not in parent and counts[holder, holder_slot] > 0:
                        parent[holder] = (taker, slot)
                        queue.append(holder)
    return None


# --- dirichlet_prior (SimFAFL/FedCR non-IID2, MAN, FedDyn) ---------------------------------------------


def _dirichlet_prior(labels: np.ndarray, num_classes: int, num_clients: int, alpha: float,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Per-client prior π_i ~ Dir(α·1_C); equal sizes; each sample's class drawn from its client's prior.
    ``haozzh/FedCR`` rule ``Dirichlet`` picks a client with room, draws a class from π_i, redraws while it is
    exhausted. Here clients are served in a random permutation of ``n`` copies of each (picks proportional to
    room left, not uniform [U]), and the redraw is π_i restricted to available classes (same distribution)."""
    per_client = len(labels) // num_clients
    priors = rng.dirichlet(np.full(num_classes, alpha), size=num_clients)
    clients = rng.permutation(np.repeat(np.arange(num_clients), per_client))
    classes = _draw_classes(priors, clients, np.bincount(labels, minlength=num_classes), rng)
    counts = np.bincount(clients * num_classes + classes, minlength=num_clients * num_classes)
    return _deal(labels, counts.reshape(num_clients, num_classes), rng)


def _draw_classes(priors: np.ndarray, clients: np.ndarray, left: np.ndarray, rng: np.random.Generator,
                  chunk: int = 8192) -> np.ndarray:
    """One class per entry of ``clients``, from that client's prior over classes not yet exhausted (chunks,
    keeping the prefix before the first overdraw: at most ``len/chunk + C`` rounds)."""
    classes = np.empty(len(clients), dtype=np.int64)
    pos = 0
    while pos < len(clients):
        available = left > 0  # a client with no prior mass left draws the available classes uniformly [U]
        masked = priors * available
        masked[masked.sum(axis=1) <= 0] = available / available.sum()
        cdf = np.cumsum(masked, axis=1)[clients[pos:pos + chunk]]
        # inverse CDF; zero-mass classes repeat the previous value, so the count of entries ≤ u has mass
        u = rng.random(len(cdf)) * cdf[:, -1]
        drawn = (cdf <= u[:, None]).sum(axis=1)
        over = np.flatnonzero(_rank_in_group(drawn, np.argsort(drawn, kind="stable")) >= left[drawn])
        keep = int(over[0]) if len(over) else len(drawn)  # the longest prefix taking no class beyond ``left``
        classes[pos:pos + keep] = drawn[:keep]
        left = left - np.bincount(drawn[:keep], minlength=len(left))
        pos += keep
    return classes


# --- dirichlet (FedML LDA: FedAlign, FedSOL) ----------------------------------------------------------


def _dirichlet(labels: np.ndarray, num_classes: int, num_clients: int, alpha: float, min_size: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """FedML's LDA split: per class p ~ Dir(α·1_N), full clients (≥ len/N samples) zeroed, split at cumulative
    proportions; redrawn until every client has ≥ ``min_size`` (:data:`DIRICHLET_MAX_DRAWS` times)."""
    if min_size * num_clients > len(labels):
        raise FLTuneError(
            f"partition.min_size: {num_clients} clients × {min_size} exceeds the {len(labels)} samples; "
            f"allowed: at most {len(labels) // num_clients}"
        )
    class_sizes = np.bincount(labels, minlength=num_classes)
    for _ in range(DIRICHLET_MAX_DRAWS):
        counts = _lda_counts(class_sizes, num_clients, alpha, rng)
        if counts is not None and counts.sum(axis=1).min() >= min_size:
            return _deal(labels, counts, rng)
    raise FLTuneError(
        f"partition.alpha/partition.min_size: no split with every client ≥ {min_size} samples in "
        f"{DIRICHLET_MAX_DRAWS} draws at alpha={alpha} over {num_clients} clients; raise partition.alpha "
        f"or lower partition.min_size"
    )


def _lda_counts(class_sizes: np.ndarray, num_clients: int, alpha: float,
                rng: np.random.Generator) -> np.ndarray | None:
    """One LDA draw as a [clients, classes] count matrix; None when no client has room for a class."""
    cap = class_sizes.sum() / num_clients
    counts = np.zeros((num_clients, len(class_sizes)), dtype=np.int64)
    for cls, size in enumerate(class_sizes):
        p = rng.dirichlet(np.full(num_clients, alpha)) * (counts.sum(axis=1) < cap)
        if not p.sum() > 0:
            return None
        cuts = (np.cumsum(p / p.sum()) * size).astype(np.int64)[:-1]
        counts[:, cls] = np.diff(cuts, prepend=0, append=size)
    return counts


# --- shards (FedAvg pathological split, FedSOL) -------------------------------------------------------


def _shards(labels: np.ndarray, num_clients: int, shards_per_client: int,
            rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by label (ties shuffled), cut into N·s near-equal shards, give each client s at random."""
    num_shards = num_clients * shards_per_client
    if shards_per_client < 1 or num_shards > len(labels):
        raise FLTuneError(
            f"partition.shards_per_client: must be in 1..{len(labels) // num_clients} so that "
            f"{num_clients} clients' shards fit in {len(labels)} samples; got {shards_per_client}"
        )
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    picks = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.concatenate([shards[s] for s in row]) for row in picks]


def _class_shards(labels: np.ndarray, num_classes: int, num_clients: int, shards_per_client: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """FedSOL's sharding as its code runs it (``Lee-Gihun/FedSOL:train_tools/preprocessing/partition_strategy.py``,
    ``_sharding_partition``): each class is cut, in data order, into m = ⌊s·N/C⌋ shards, so no shard mixes classes. A
    shuffled plan of every class m times, padded to a multiple of N by repeating entries 1, 2, … (the code's padding),
    gives each client s labels, each a random shard left of that class. A client handed only labels whose shards are
    gone (C ∤ s·N) gets the previous client's samples, as in the code: then two clients hold the same samples."""
    per_class = shards_per_client * num_clients // num_classes
    if shards_per_client < 1 or per_class < 1:
        raise FLTuneError(f"partition.shards_per_client: must be at least {-(-num_classes // num_clients)} so that "
                          f"{num_clients} clients' shards cover {num_classes} classes; got {shards_per_client}")
    shards = [np.array_split(np.flatnonzero(labels == c), per_class) for c in range(num_classes)]
    plan = list(rng.permutation(np.repeat(np.arange(num_classes), per_class)))
    for i in range(1, num_clients + 1):
        if len(plan) % num_clients == 0:
            break
        plan.append(plan[i])
    parts: list[np.ndarray] = []
    for wanted in np.array(plan).reshape(num_clients, -1):
        taken = [shards[c].pop(rng.integers(len(shards[c]))) for c in wanted if shards[c]]
        parts.append(np.concatenate(taken) if taken else parts[-1] if parts else np.array([], dtype=np.int64))
    return parts


# --- shared -------------------------------------------------------------------------------------------


def _deal(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Give client j ``counts[j, c]`` random samples of class c (a [clients, classes] matrix)."""
    num_clients, num_classes = counts.shape
    samples, owners = [], []
    for cls in range(num_classes):
        owner = np.repeat(np.arange(num_clients), counts[:, cls])
        samples.append(rng.permutation(np.flatnonzero(labels == cls))[:len(owner)])
        owners.append(owner)
    owners_all = np.concatenate(owners)
    order = np.argsort(owners_all, kind="stable")
    bounds = np.cumsum(np.bincount(owners_all, minlength=num_clients))[:-1]
    return np.split(np.concatenate(samples)[order], bounds)

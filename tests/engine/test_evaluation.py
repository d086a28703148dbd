"""Evaluation scores (engine/evaluation.py) are the per-batch figures of the loop that read each batch, read once."""

import torch

from fltune.data.augment import to_float
from fltune.engine.builders import build_model_for
from fltune.engine.evaluation import EVAL_BATCH, batch_scores
from fltune.engine.transfer import load_state
from tests.engine.helpers import ScalarReads
from tests.engine.test_local import _final_round_setup


def per_batch_reads(model, data, x, y, batches) -> list[tuple[int, float]]:
    """The evaluation loop before scores stayed on the device: each batch normalised by ``to_float`` and its
    loss and correct count read as it is scored."""
    scores = []
    with torch.no_grad():
        model.eval()
        for b in batches:
            rows = slice(b * EVAL_BATCH, (b + 1) * EVAL_BATCH)
            xb, yb = to_float(x[rows], data.mean, data.std), y[rows]
            logits = model(xb)
            loss = float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
            scores.append((int((logits.argmax(1) == yb).sum()), loss))
    return scores


def test_evaluation_scores_are_the_per_batch_reads_bit_for_bit_with_no_read_per_batch():
    """A shard that starts past batch 0 and ends on a short batch: equal (correct, loss) pairs, the loss to
    the bit (float32 sums widened to float64 on the device, as ``float`` widens them), and no scalar read of
    the device inside the loop (the old loop made two a batch)."""
    cfg, data, _, inputs = _final_round_setup("fedavg")
    model = build_model_for(cfg, data)
    load_state(model, inputs.global_state)
    x, y = data.x[:730], data.y[:730]
    scores = {}
    for batches in (range(8), range(2, 8), []):
        with ScalarReads() as reads:
            scores[len(batches)] = batch_scores(model, data, x, y, torch.device("cpu"), batches)
        assert scores[len(batches)] == per_batch_reads(model, data, x, y, batches)
        assert reads.count == 0
    assert len(scores[8]) == 8 and scores[8][-1][0] <= 30  # the last batch holds 30 images

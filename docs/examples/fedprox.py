from pydantic import Field

import fltune


class FedProx(fltune.Method):
    name, stored_models, passes_per_step = "my_fedprox", 2.0, 1.0  # costs: w_g held beside w; one pass a step

    class Params(fltune.Params):
        mu: float = Field(0.01, ge=0, description="proximal weight μ")

    def local_loss(self, batch):
        logits = batch.forward(batch.weights, batch.x)
        distance = sum(((w - batch.global_weights[n]) ** 2).sum() for n, w in batch.weights.items())
        return batch.cross_entropy(logits) + self.params.mu / 2 * distance, logits  # Li et al., 2020

"""A user's Ditto (Li, Hu, Beirami & Smith, 2021): each client trains the global model w by FedAvg and, on the same
batches, its personal model v_k ← v_k − η·∇[CE(v_k) + (λ/2)‖v_k − w_g‖²] (Eq. 2), kept and never uploaded.
Run it with `--method ./ditto.py:Ditto`; the personalised evaluation scores v_k."""
import copy

from pydantic import Field

import fltune


class Ditto(fltune.Method):
    name, stored_models, passes_per_step = "my_ditto", 2.0, 2.0  # v_k beside w; both trained on every batch
    final_round = "own"  # the final personal round is one more Ditto update, scoring v_k

    class Params(fltune.Params):
        lam: float = Field(0.1, ge=0, description="proximal weight λ of the personal model")

    def setup_client(self, ctx):
        """The client model loaded is v_k (w_g at its first round): kept aside, and w trained from w_g."""
        personal = copy.deepcopy(ctx.model)
        ctx.scratch["personal"] = personal
        ctx.inputs["personal"] = {n: p.detach() for n, p in personal.named_parameters()}
        ctx.model.load_state_dict(ctx.global_state)

    def step(self, batch):
        """FedAvg's gradient for w; one SGD step of v_k on Eq. 2, handed back with `batch.keep`."""
        step = super().step(batch)
        personal, v = batch.model("personal"), batch.inputs["personal"]

        def eq_2(v):
            distance = sum(((p - batch.global_weights[n]) ** 2).sum() for n, p in v.items())
            return batch.cross_entropy(personal(v, batch.x)) + self.params.lam / 2 * distance, ()

        grads, _, _ = batch.gradient(eq_2, v)
        batch.keep("personal", {n: p - batch.lr * grads[n] for n, p in v.items()})
        return step

    def client_result(self, ctx):
        """Upload w as FedAvg does; keep v_k as the client's personal weights (its next round starts there)."""
        result = super().client_result(ctx)
        result.state["personal"] = {k: t.cpu().numpy() for k, t in ctx.scratch["personal"].state_dict().items()}
        return result
